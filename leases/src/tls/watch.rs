//! Reloading TLS material while a process runs (issue 20): a task that
//! reads the certificate, key and CA bundle files every few seconds and
//! reloads them when their content changed, or at once when asked (the
//! binary asks on SIGHUP). A reload that fails (a half-copied pair, a
//! certificate its bundle does not vouch for, another identity) changes
//! nothing and is logged; the next change of the files is tried again.
//! It also warns, once an hour, while a certificate in use expires within
//! `EXPIRY_WARNING`.
//!
//! A driver: which material is acceptable is `TlsMaterial::load`'s and
//! `LiveTls::replace`'s decision, what is due for a warning `expiring`'s.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{read_limited, LiveTls, TlsError, TlsFiles, TlsMaterial, TlsStatus};

/// How long before a certificate in use expires the watcher starts warning.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How often an expiry warning is repeated while it holds.
const WARNING_EVERY_S: i64 = 3_600;

/// Something whose TLS material a watcher keeps current: which files it
/// comes from, how to load them and swap them in, what is in use now.
pub trait Reload: Send + Sync {
    /// The files whose content is watched.
    fn files(&self) -> Vec<PathBuf>;
    /// Loads the files and puts them in use; an error changes nothing.
    fn reload(&self) -> Result<TlsStatus, Box<dyn std::error::Error + Send + Sync>>;
    /// What is in use now.
    fn status(&self) -> TlsStatus;
}

/// The agent's and the arbiter's material: one set of files, one
/// `LiveTls`.
pub struct FileReload {
    /// The files.
    pub files: TlsFiles,
    /// The material in use.
    pub live: Arc<LiveTls>,
}

impl Reload for FileReload {
    fn files(&self) -> Vec<PathBuf> {
        vec![
            self.files.ca.clone(),
            self.files.cert.clone(),
            self.files.key.clone(),
            super::revoked::beside(&self.files.ca),
        ]
    }

    fn reload(&self) -> Result<TlsStatus, Box<dyn std::error::Error + Send + Sync>> {
        let material = TlsMaterial::load(&self.files)?;
        Ok(self.live.replace(&material, &self.files.cert)?)
    }

    fn status(&self) -> TlsStatus {
        self.live.status()
    }
}

/// The certificates of `status` that expire within `EXPIRY_WARNING` of
/// `now_unix_s`, as (what, notAfter, seconds left).
pub fn expiring(status: &TlsStatus, now_unix_s: i64) -> Vec<(String, String, i64)> {
    let within = EXPIRY_WARNING.as_secs() as i64;
    std::iter::once(("certificate".to_owned(), &status.leaf))
        .chain(
            status
                .cas
                .iter()
                .map(|ca| (format!("CA certificate (serial {})", ca.serial), ca)),
        )
        .filter(|(_, cert)| cert.expires_in_s(now_unix_s) <= within)
        .map(|(what, cert)| (what, cert.not_after.clone(), cert.expires_in_s(now_unix_s)))
        .collect()
}

/// A running watcher; stops when dropped.
pub struct Watcher {
    now: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Watcher {
    /// Watches `reload`'s files every `every` (never when `None`: reloads
    /// happen only when asked), naming the process part `what` in its logs.
    pub fn spawn(what: &'static str, reload: Arc<dyn Reload>, every: Option<Duration>) -> Watcher {
        let now = Arc::new(Notify::new());
        // The files as they are now: a change from here on is a change.
        let seen = fingerprint(&reload.files());
        let task = tokio::spawn(run(what, reload, every, seen, now.clone()));
        Watcher { now, task }
    }

    /// Reloads at once (SIGHUP), whether or not the files changed.
    pub fn reload_now(&self) {
        self.now.notify_one();
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A hash of the files' content (a file that cannot be read hashes as its
/// error, so its return is a change too).
fn fingerprint(files: &[PathBuf]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for file in files {
        match read_limited(file) {
            Ok(bytes) => bytes.hash(&mut hasher),
            Err(TlsError::Io { reason, .. }) => reason.kind().hash(&mut hasher),
            Err(other) => other.to_string().hash(&mut hasher),
        }
    }
    hasher.finish()
}

async fn run(
    what: &'static str,
    reload: Arc<dyn Reload>,
    every: Option<Duration>,
    mut seen: u64,
    now: Arc<Notify>,
) {
    let files = reload.files();
    let mut warned_at: Option<i64> = None;
    loop {
        warn_expiring(what, &reload.status(), &mut warned_at);
        let asked = tokio::select! {
            _ = now.notified() => true,
            _ = sleep(every) => false,
        };
        let current = fingerprint(&files);
        if !asked && current == seen {
            continue;
        }
        seen = current;
        match reload.reload() {
            Ok(status) => {
                tracing::info!(
                    part = what,
                    identity = %status.identity,
                    serial = %status.leaf.serial,
                    not_after = %status.leaf.not_after,
                    cas = status.cas.len(),
                    asked,
                    "TLS material reloaded: new handshakes use it, established sessions keep theirs"
                );
                warned_at = None;
            }
            Err(error) => tracing::warn!(
                part = what,
                error = %error,
                "TLS material not reloaded; the material in use stays"
            ),
        }
    }
}

async fn sleep(every: Option<Duration>) {
    match every {
        Some(every) => tokio::time::sleep(every).await,
        None => std::future::pending().await,
    }
}

/// Logs a warning for each certificate in use that expires soon, at most
/// once every `WARNING_EVERY_S`.
fn warn_expiring(what: &'static str, status: &TlsStatus, warned_at: &mut Option<i64>) {
    let now_s = crate::clock::now_ms() as i64 / 1_000;
    if warned_at.is_some_and(|at| now_s - at < WARNING_EVERY_S) {
        return;
    }
    let soon = expiring(status, now_s);
    if soon.is_empty() {
        return;
    }
    *warned_at = Some(now_s);
    for (certificate, not_after, left_s) in soon {
        tracing::warn!(
            part = what,
            identity = %status.identity,
            certificate = %certificate,
            not_after = %not_after,
            expires_in_s = left_s,
            "a certificate in use expires within 7 days: renew it (`rollcall certs --renew`, or rotate the CA) and copy it into place; it is reloaded without a restart"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Role;
    use crate::identity::Identity;
    use crate::name::{Label, PrincipalName};
    use crate::tls::{renew_certs, write_certs, CertStatus, ServerNames};

    /// A certificate directory with one agent's files, and that agent's
    /// material in use.
    fn agent_dir() -> (tempfile::TempDir, TlsFiles, Arc<LiveTls>) {
        let dir = tempfile::tempdir().unwrap();
        let agent = Identity::new(
            Label::new("r1").unwrap(),
            Role::Agent,
            PrincipalName::new("n1").unwrap(),
        );
        write_certs(
            dir.path(),
            &Label::new("r1").unwrap(),
            std::slice::from_ref(&agent),
            &ServerNames::default(),
        )
        .unwrap();
        let files = TlsFiles::in_dir(dir.path(), &agent);
        let live = LiveTls::new(&TlsMaterial::load(&files).unwrap()).unwrap();
        (dir, files, live)
    }

    /// Waits (bounded) until `live` presents a certificate other than
    /// `serial`; answers the new serial.
    async fn changed_from(live: &LiveTls, serial: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let now = live.status().leaf.serial;
            if now != serial {
                return now;
            }
            assert!(tokio::time::Instant::now() < deadline, "never reloaded");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn changed_files_are_reloaded_and_a_bad_pair_is_not() {
        let (dir, files, live) = agent_dir();
        let reload = Arc::new(FileReload {
            files: files.clone(),
            live: live.clone(),
        });
        let _watcher = Watcher::spawn("test", reload, Some(Duration::from_millis(50)));
        let first = live.status().leaf.serial;
        renew_certs(dir.path(), &Label::new("r1").unwrap()).unwrap();
        let second = changed_from(&live, &first).await;
        // A key that is not the certificate's: refused, the pair in use stays.
        let before_key = std::fs::read(&files.key).unwrap();
        let stranger = crate::tls::Ca::generate(&Label::new("r1").unwrap()).unwrap();
        std::fs::write(&files.key, stranger.to_pem().1).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(live.status().leaf.serial, second, "a bad pair is not used");
        // The right key back: reloaded (a change from the refused state).
        std::fs::write(&files.key, before_key).unwrap();
        renew_certs(dir.path(), &Label::new("r1").unwrap()).unwrap();
        changed_from(&live, &second).await;
    }

    #[tokio::test]
    async fn without_an_interval_only_a_request_reloads() {
        let (dir, files, live) = agent_dir();
        let reload = Arc::new(FileReload {
            files,
            live: live.clone(),
        });
        let watcher = Watcher::spawn("test", reload, None);
        let first = live.status().leaf.serial;
        renew_certs(dir.path(), &Label::new("r1").unwrap()).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(live.status().leaf.serial, first, "no interval: not read");
        watcher.reload_now();
        changed_from(&live, &first).await;
    }

    fn cert(serial: &str, not_after_unix_s: i64) -> CertStatus {
        CertStatus {
            serial: serial.to_owned(),
            not_after: format!("t{not_after_unix_s}"),
            not_after_unix_s,
        }
    }

    #[test]
    fn only_certificates_within_seven_days_are_expiring() {
        let day = 24 * 3_600;
        let status = TlsStatus {
            identity: "rollcall://r1/agent/a".to_owned(),
            leaf: cert("01", 1_000 + 6 * day),
            cas: vec![cert("0a", 1_000 + 400 * day), cert("0b", 1_000 + 7 * day)],
        };
        let soon = expiring(&status, 1_000);
        assert_eq!(
            soon,
            vec![
                (
                    "certificate".to_owned(),
                    format!("t{}", 1_000 + 6 * day),
                    6 * day
                ),
                (
                    "CA certificate (serial 0b)".to_owned(),
                    format!("t{}", 1_000 + 7 * day),
                    7 * day
                ),
            ]
        );
        assert_eq!(
            expiring(&status, 1_000 - 1).len(),
            1,
            "the CA is a second outside"
        );
    }
}
