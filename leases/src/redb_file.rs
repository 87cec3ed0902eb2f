//! Opening one redb file durably, shared by the arbiter's stores: create the
//! directory, check every page checksum on open (a file damaged outside
//! redb is refused, never trusted), and fsync the directory so a new file's
//! entry survives power loss. Each store maps the failure onto its own
//! error, which says what to do.

use std::fs::File;
use std::path::{Path, PathBuf};

use redb::{Database, DatabaseError};

/// Why a redb file could not be opened.
pub(crate) enum OpenFailure {
    /// The directory could not be created or synced.
    Directory(std::io::Error),
    /// Another process (or this one) has the file open.
    Locked(PathBuf),
    /// redb refused the file.
    Open(PathBuf, Box<DatabaseError>),
}

/// Opens (creating if needed) `dir/file`.
pub(crate) fn open(dir: &Path, file: &str) -> Result<(Database, PathBuf), OpenFailure> {
    std::fs::create_dir_all(dir).map_err(OpenFailure::Directory)?;
    let path = dir.join(file);
    let db = redb::Builder::new()
        .set_check_integrity_on_open(true)
        .create(&path)
        .map_err(|e| match e {
            DatabaseError::DatabaseAlreadyOpen => OpenFailure::Locked(path.clone()),
            other => OpenFailure::Open(path.clone(), Box::new(other)),
        })?;
    // A new file's directory entry is durable only once the directory is.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(OpenFailure::Directory)?;
    Ok((db, path))
}
