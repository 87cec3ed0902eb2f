//! Reading a config file and parsing its TOML into a typed struct. This is
//! the only place the crate touches the filesystem; it must not validate
//! values (each config's `validate` does, so in-memory configs get the same
//! rules).

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::ConfigError;

/// Origin named in parse errors of text that did not come from a file.
pub(crate) const INLINE_ORIGIN: &str = "<string>";

/// Reads `path` as UTF-8 text.
pub(crate) fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses TOML text; `origin` (a file path or [`INLINE_ORIGIN`]) prefixes
/// the error so the operator knows which file to open.
pub(crate) fn parse<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|error: toml::de::Error| ConfigError::Parse {
        origin: origin.to_owned(),
        message: error.to_string().trim_end().to_owned(),
    })
}

/// A config file type: parsed from TOML and always validated on the way in,
/// so no caller can hold a config that skipped its rules.
pub trait ConfigFile: DeserializeOwned {
    /// Checks every rule; the first broken one is returned, naming its full
    /// dotted field path.
    fn validate(&self) -> Result<(), ConfigError>;

    /// Parses and validates TOML held in memory.
    fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let config: Self = parse(text, INLINE_ORIGIN)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let config: Self = parse(&read(path)?, &path.display().to_string())?;
        config.validate()?;
        Ok(config)
    }
}
