//! Crash-safe small files: the one way the agent puts state on disk (its
//! cached snapshots, registrations and checks, R7).
//!
//! A file is `[magic "RCF1"][payload length u64 LE][crc32 of payload u32 LE]
//! [payload]`. It is written to a temporary file in the same directory,
//! fsynced, renamed over the target and the directory fsynced, so after a
//! crash or power loss the target holds either the old or the new contents,
//! never a mix. Reading verifies the magic, the length and the checksum, so a
//! torn or rotted file is reported as corrupt instead of being used.
//!
//! This module only moves bytes; it must not interpret payloads, and it never
//! deletes a corrupt file on its own: the caller decides (see `cache.rs`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The first four bytes of every file written here (format version 1).
pub const MAGIC: [u8; 4] = *b"RCF1";

/// Bytes before the payload: magic, length, checksum.
pub const HEADER_LEN: usize = 4 + 8 + 4;

/// Why a file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// The operating system refused an operation; the OS error is the `source`.
    #[error("cannot {op} {}", path.display())]
    Io {
        /// What was being done ("open", "write", "rename to", …).
        op: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// The file exists but is not a complete, intact file of this format.
    /// Its contents must not be used; discard it and fetch the data again.
    #[error("{} is corrupt: {detail}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong: bad magic, truncation, length over the limit,
        /// trailing bytes or checksum mismatch.
        detail: String,
    },
}

fn io_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DurableError + 'a {
    move |source| DurableError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Makes temporary names unique within this process; the process id makes
/// them unique across processes sharing a directory.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The directory holding `path` (`.` for a bare file name) and its file name.
fn split(path: &Path) -> Result<(&Path, &std::ffi::OsStr), DurableError> {
    let name = path.file_name().ok_or_else(|| DurableError::Io {
        op: "write",
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"),
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((dir, name))
}

/// Fsyncs a directory, so a rename or removal inside it survives power loss.
fn sync_dir(dir: &Path) -> Result<(), DurableError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("sync directory", dir))
}

/// Replaces the file at `path` with `payload`, atomically and durably.
///
/// The temporary file is named `.<file name>.tmp.<pid>.<n>` in the same
/// directory (a rename is only atomic within one file system). If anything
/// fails the temporary file is removed and `path` is untouched; a crash can
/// leave one behind, which readers of `path` never look at.
pub fn write_atomic(path: &Path, payload: &[u8]) -> Result<(), DurableError> {
    let (dir, name) = split(path)?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(
        ".tmp.{}.{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = dir.join(temp_name);

    let result = write_temp(&temp, payload).and_then(|()| {
        fs::rename(&temp, path).map_err(|source| DurableError::Io {
            op: "rename a temporary file to",
            path: path.to_path_buf(),
            source,
        })
    });
    if result.is_err() {
        // Best effort: the error being returned matters more than this one.
        let _ = fs::remove_file(&temp);
        return result;
    }
    sync_dir(dir)
}

fn write_temp(temp: &Path, payload: &[u8]) -> Result<(), DurableError> {
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&MAGIC);
    header[4..12].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    header[12..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());

    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(temp)
        .map_err(io_error("create", temp))?;
    file.write_all(&header)
        .and_then(|()| file.write_all(payload))
        .map_err(io_error("write", temp))?;
    file.sync_all().map_err(io_error("sync", temp))
}

/// Reads and verifies a file written by [`write_atomic`].
///
/// Returns `Ok(None)` when the file does not exist, and
/// [`DurableError::Corrupt`] when it is not intact or its payload is longer
/// than `max_len` bytes (checked before the payload is read, so a damaged
/// length field cannot make this allocate more than the file holds).
pub fn read_verified(path: &Path, max_len: u64) -> Result<Option<Vec<u8>>, DurableError> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("open", path)(e)),
    };
    let corrupt = |detail: String| DurableError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };

    let mut header = Vec::with_capacity(HEADER_LEN);
    (&mut file)
        .take(HEADER_LEN as u64)
        .read_to_end(&mut header)
        .map_err(io_error("read", path))?;
    if header.len() < HEADER_LEN {
        return Err(corrupt(format!(
            "truncated header: {} of {HEADER_LEN} bytes",
            header.len()
        )));
    }
    let (magic, rest) = header.split_at(4);
    let (len, crc) = rest.split_at(8);
    if magic != MAGIC {
        return Err(corrupt(format!(
            "bad magic {magic:02x?}, expected {MAGIC:02x?} (\"RCF1\")"
        )));
    }
    let len = u64::from_le_bytes(len.try_into().expect("8-byte slice"));
    let crc = u32::from_le_bytes(crc.try_into().expect("4-byte slice"));
    if len > max_len {
        return Err(corrupt(format!(
            "payload length {len} exceeds the limit of {max_len} bytes"
        )));
    }

    let on_disk = file.metadata().map_err(io_error("read", path))?.len();
    let capacity = len.min(on_disk.saturating_sub(HEADER_LEN as u64));
    let mut payload = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
    // One byte past the stated length reveals trailing garbage.
    file.take(len.saturating_add(1))
        .read_to_end(&mut payload)
        .map_err(io_error("read", path))?;
    let got = payload.len() as u64;
    if got < len {
        return Err(corrupt(format!("truncated payload: {got} of {len} bytes")));
    }
    if got > len {
        return Err(corrupt(format!(
            "bytes after the {len}-byte payload the header announces"
        )));
    }
    let computed = crc32fast::hash(&payload);
    if computed != crc {
        return Err(corrupt(format!(
            "checksum mismatch: header says {crc:08x}, payload gives {computed:08x}"
        )));
    }
    Ok(Some(payload))
}

/// Removes the file at `path` durably (the directory is fsynced, so the file
/// does not come back after power loss). Returns whether a file was there.
pub fn remove(path: &Path) -> Result<bool, DurableError> {
    let (dir, _) = split(path)?;
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error("remove", path)(e)),
    }
    sync_dir(dir)?;
    Ok(true)
}

/// Renames the file at `from` to `to` (same directory) durably: the
/// directory is fsynced, so after power loss the file is under one name or
/// the other, never both or neither.
pub fn rename(from: &Path, to: &Path) -> Result<(), DurableError> {
    let (dir, _) = split(to)?;
    fs::rename(from, to).map_err(io_error("rename", from))?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corrupt_detail(result: Result<Option<Vec<u8>>, DurableError>) -> String {
        match result {
            Err(DurableError::Corrupt { detail, .. }) => detail,
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn round_trip_and_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.bin");
        write_atomic(&path, b"first").unwrap();
        assert_eq!(read_verified(&path, 1024).unwrap().unwrap(), b"first");
        write_atomic(&path, b"").unwrap();
        assert_eq!(read_verified(&path, 1024).unwrap().unwrap(), b"");
        write_atomic(&path, b"third payload").unwrap();
        assert_eq!(
            read_verified(&path, 1024).unwrap().unwrap(),
            b"third payload"
        );
        let raw = fs::read(&path).unwrap();
        assert_eq!(&raw[..4], b"RCF1");
        assert_eq!(raw.len(), HEADER_LEN + b"third payload".len());
        // Only the target is left in the directory.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_verified(&dir.path().join("absent"), 1024)
            .unwrap()
            .is_none());
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"a small payload").unwrap();
        let good = fs::read(&path).unwrap();
        for i in 0..good.len() {
            // The whole byte, then each bit alone.
            for flip in std::iter::once(0xffu8).chain((0..8).map(|b| 1 << b)) {
                let mut bad = good.clone();
                bad[i] ^= flip;
                fs::write(&path, &bad).unwrap();
                let detail = corrupt_detail(read_verified(&path, 1 << 20));
                assert!(!detail.is_empty(), "byte {i} flip {flip:#x}");
            }
        }
    }

    #[test]
    fn each_kind_of_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"payload").unwrap();
        let good = fs::read(&path).unwrap();

        let mut bad = good.clone();
        bad[0] = b'X';
        fs::write(&path, &bad).unwrap();
        assert!(corrupt_detail(read_verified(&path, 1024)).contains("magic"));

        let mut bad = good.clone();
        bad[HEADER_LEN] ^= 1;
        fs::write(&path, &bad).unwrap();
        assert!(corrupt_detail(read_verified(&path, 1024)).contains("checksum"));

        let mut bad = good.clone();
        bad.push(0);
        fs::write(&path, &bad).unwrap();
        assert!(corrupt_detail(read_verified(&path, 1024)).contains("after"));

        fs::write(&path, &good).unwrap();
        assert!(corrupt_detail(read_verified(&path, 3)).contains("limit of 3"));

        let mut bad = good.clone();
        bad[4..12].copy_from_slice(&u64::MAX.to_le_bytes());
        fs::write(&path, &bad).unwrap();
        assert!(corrupt_detail(read_verified(&path, u64::MAX)).contains("truncated payload"));
    }

    #[test]
    fn truncation_at_every_length_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"truncate me").unwrap();
        let good = fs::read(&path).unwrap();
        for len in 0..good.len() {
            fs::write(&path, &good[..len]).unwrap();
            let detail = corrupt_detail(read_verified(&path, 1024));
            assert!(detail.contains("truncated"), "length {len}: {detail}");
        }
    }

    #[test]
    fn a_leftover_temp_file_does_not_confuse_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"committed").unwrap();
        // What a crash between writing the temp file and the rename leaves.
        let leftover = dir
            .path()
            .join(format!(".f.tmp.{}.999", std::process::id()));
        fs::write(&leftover, b"RCF1 half-written").unwrap();
        assert_eq!(read_verified(&path, 1024).unwrap().unwrap(), b"committed");
        write_atomic(&path, b"next").unwrap();
        assert_eq!(read_verified(&path, 1024).unwrap().unwrap(), b"next");
        assert_eq!(fs::read(&leftover).unwrap(), b"RCF1 half-written");
    }

    #[test]
    fn a_failed_write_leaves_the_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"old").unwrap();
        // Renaming a file over a non-empty directory fails.
        let blocked = dir.path().join("blocked");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("x"), b"").unwrap();
        let err = write_atomic(&blocked, b"new").unwrap_err();
        assert!(err.to_string().contains("blocked"), "{err}");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "temp file left behind: {names:?}");
        assert_eq!(read_verified(&path, 1024).unwrap().unwrap(), b"old");
    }

    #[test]
    fn io_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_verified(dir.path(), 1024).unwrap_err();
        assert!(matches!(err, DurableError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains(&*dir.path().to_string_lossy()));
        let missing = dir.path().join("no-such-dir").join("f");
        let err = write_atomic(&missing, b"x").unwrap_err();
        assert!(err.to_string().contains("no-such-dir"), "{err}");
    }

    #[test]
    fn remove_reports_whether_a_file_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"x").unwrap();
        assert!(remove(&path).unwrap());
        assert!(!remove(&path).unwrap());
        assert!(read_verified(&path, 1024).unwrap().is_none());
    }
}
