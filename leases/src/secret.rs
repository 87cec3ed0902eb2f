//! Bearer tokens kept in files readable by their owner only: the arbiter's
//! operator token (`admin.token`) and the agent's node token
//! (`agent.token`). Created on first start, reused after.

use std::io::Write;
use std::path::Path;

/// Reads the token in `path`, creating one (32 random bytes as hex, mode
/// 0600, fsynced) if the file is missing or empty.
pub fn ensure_token(path: &Path) -> std::io::Result<String> {
    if let Ok(existing) = std::fs::read_to_string(path) {
        let token = existing.trim().to_owned();
        if !token.is_empty() {
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
}
