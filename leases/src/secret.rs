//! Secrets kept in files readable by their owner only, and data
//! directories only their owner may enter: the arbiter's operator token
//! (`admin.token`), the agent's node token (`agent.token`), TLS private
//! keys and zone gossip keys. Tokens are created on first start and reused
//! after, and compared in constant time.
//!
//! A secret file or data directory that group or others may read is
//! restricted to its owner (0600, 0700) with a warning naming it; when that
//! fails (the file is not ours) the process refuses to use it.

use std::io::Write;
use std::path::Path;

use subtle::ConstantTimeEq;

/// Whether `given` is the token `expected`, compared in constant time (a
/// caller learns nothing from how long a wrong guess took; the length of
/// the token is not secret).
pub fn token_matches(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// Restricts the secret file `path` to its owner when group or others may
/// read or write it, with a warning naming the file; an error when that
/// cannot be done.
pub fn owner_only(path: &Path) -> std::io::Result<()> {
    restrict(path, 0o600, "secret file")
}

/// Creates the data directory `path` (and missing parents) for its owner
/// only, or restricts an existing one that group or others may enter, with
/// a warning naming it.
pub fn private_dir(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(path)?;
    restrict(path, 0o700, "data directory")
}

#[cfg(unix)]
fn restrict(path: &Path, mode: u32, what: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let before = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if before & 0o077 == 0 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "{what} {} is open to group or others (mode {before:o}) and could not be restricted to its owner: {e}; run chmod {mode:o} on it",
                path.display()
            ),
        )
    })?;
    tracing::warn!(path = %path.display(), before = format!("{before:o}"), after = format!("{mode:o}"), "{what} was open to group or others; restricted to its owner");
    Ok(())
}

#[cfg(not(unix))]
fn restrict(_path: &Path, _mode: u32, _what: &str) -> std::io::Result<()> {
    Ok(())
}

/// Reads the token in `path`, creating one (32 random bytes as hex, mode
/// 0600, fsynced) if the file is missing or empty.
pub fn ensure_token(path: &Path) -> std::io::Result<String> {
    if let Ok(existing) = std::fs::read_to_string(path) {
        let token = existing.trim().to_owned();
        if !token.is_empty() {
            owner_only(path)?;
            return Ok(token);
        }
    }
    let bytes: [u8; 32] = rand::random();
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(token.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    Ok(token)
}

/// Reads a token file written by `ensure_token` (for CLI clients).
pub fn read_token(path: &Path) -> std::io::Result<String> {
    let token = std::fs::read_to_string(path)?.trim().to_owned();
    if token.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_created_once_with_owner_only_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.token");
        let first = ensure_token(&path).unwrap();
        assert_eq!(first.len(), 64);
        assert_eq!(ensure_token(&path).unwrap(), first);
        assert_eq!(read_token(&path).unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn secrets_open_to_others_are_restricted_to_their_owner() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("agent.token");
        std::fs::write(&token, "0123\n").unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(ensure_token(&token).unwrap(), "0123");
        assert_eq!(mode(&token), 0o600);
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&data).unwrap();
        assert_eq!(mode(&data), 0o700);
        let fresh = dir.path().join("a/b");
        private_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
    }

    #[test]
    fn tokens_match_only_themselves() {
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abd", "abc"));
        assert!(!token_matches("ab", "abc"));
        assert!(!token_matches("", "abc"));
    }
}
