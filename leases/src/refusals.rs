//! The audit of what the arbiter refused (issue 38, item 8): a refused
//! request, a refused Hello, a denied watch. Refusals change nothing, so
//! the catalog's audit log (committed changes) never holds them; they go
//! to the process log under the `rollcall::audit` target instead, with who
//! asked and why.
//!
//! A flood must not fill that log: the first refusal of one identity for
//! one kind is written at once; repeats within [`WINDOW_MS`] are only
//! counted, and written as one line ("… refused 1,234 more times in the
//! last 60 s") when the window ends. At most [`MAX_KEYS`] identity-kind
//! pairs are tracked at once; past that, repeats of new pairs are counted
//! under one shared key. Sans-IO: the time comes with each call.

use std::collections::BTreeMap;

/// How long repeats of one identity's refusals of one kind are folded
/// into one line, ms.
pub const WINDOW_MS: u64 = 60_000;

/// Identity-kind pairs tracked at once.
pub const MAX_KEYS: usize = 1_024;

/// The key that counts the pairs past [`MAX_KEYS`].
const OVERFLOW: (&str, &str) = ("(other identities)", "(any)");

/// One line for the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditLine {
    /// The first refusal of this identity and kind in a window.
    First {
        /// Who asked.
        identity: String,
        /// What was refused (`request`, `hello`, `watch`).
        kind: &'static str,
        /// Why.
        reason: String,
    },
    /// Repeats folded at the end of a window.
    Repeated {
        /// Who asked.
        identity: String,
        /// What was refused.
        kind: &'static str,
        /// How many more times.
        count: u64,
        /// The last reason given.
        reason: String,
        /// Over how long, ms.
        over_ms: u64,
    },
}

impl AuditLine {
    /// Writes the line to the process log under `rollcall::audit`.
    pub fn log(&self) {
        match self {
            AuditLine::First {
                identity,
                kind,
                reason,
            } => {
                tracing::warn!(target: "rollcall::audit", identity = %identity, kind, reason = %reason, "refused");
            }
            AuditLine::Repeated {
                identity,
                kind,
                count,
                reason,
                over_ms,
            } => {
                tracing::warn!(target: "rollcall::audit", identity = %identity, kind, repeats = count, over_ms, last_reason = %reason, "refused again (repeats folded)");
            }
        }
    }
}

struct Window {
    opened_ms: u64,
    repeats: u64,
    last_reason: String,
}

/// Refusals seen, per identity and kind, in their current window.
#[derive(Default)]
pub struct RefusalAudit {
    windows: BTreeMap<(String, &'static str), Window>,
}

impl RefusalAudit {
    /// A refusal of `kind` to `identity` at `now_ms`: the line to write at
    /// once, if any (the first of a window; a repeat is only counted).
    pub fn refused(
        &mut self,
        identity: &str,
        kind: &'static str,
        reason: &str,
        now_ms: u64,
        lines: &mut Vec<AuditLine>,
    ) {
        self.flush(now_ms, lines);
        let mut key = (identity.to_owned(), kind);
        if !self.windows.contains_key(&key) && self.windows.len() >= MAX_KEYS {
            key = (OVERFLOW.0.to_owned(), OVERFLOW.1);
        }
        match self.windows.get_mut(&key) {
            Some(window) => {
                window.repeats += 1;
                reason.clone_into(&mut window.last_reason);
            }
            None => {
                lines.push(AuditLine::First {
                    identity: key.0.clone(),
                    kind: key.1,
                    reason: reason.to_owned(),
                });
                self.windows.insert(
                    key,
                    Window {
                        opened_ms: now_ms,
                        repeats: 0,
                        last_reason: reason.to_owned(),
                    },
                );
            }
        }
    }

    /// Closes the windows over by `now_ms`: their repeats as one line each.
    pub fn flush(&mut self, now_ms: u64, lines: &mut Vec<AuditLine>) {
        let over: Vec<(String, &'static str)> = self
            .windows
            .iter()
            .filter(|(_, w)| now_ms >= w.opened_ms + WINDOW_MS)
            .map(|(k, _)| k.clone())
            .collect();
        for key in over {
            let Some(window) = self.windows.remove(&key) else {
                continue;
            };
            if window.repeats > 0 {
                lines.push(AuditLine::Repeated {
                    identity: key.0,
                    kind: key.1,
                    count: window.repeats,
                    reason: window.last_reason,
                    over_ms: now_ms - window.opened_ms,
                });
            }
        }
    }

    /// Identity-kind pairs in an open window.
    pub fn tracked(&self) -> usize {
        self.windows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_refusal_is_written_and_repeats_are_folded_into_one_line() {
        let mut audit = RefusalAudit::default();
        let mut lines = Vec::new();
        for i in 0..1_000 {
            audit.refused(
                "agent:n9",
                "request",
                &format!("no {i}"),
                1_000 + i,
                &mut lines,
            );
        }
        assert_eq!(
            lines,
            vec![AuditLine::First {
                identity: "agent:n9".into(),
                kind: "request",
                reason: "no 0".into()
            }]
        );
        // Another kind, and another identity, each get their first line.
        audit.refused("agent:n9", "watch", "w", 2_000, &mut lines);
        audit.refused("agent:n8", "request", "r", 2_000, &mut lines);
        assert_eq!(lines.len(), 3);
        lines.clear();
        audit.flush(1_000 + WINDOW_MS - 1, &mut lines);
        assert!(lines.is_empty(), "the window is still open");
        audit.flush(1_000 + WINDOW_MS, &mut lines);
        assert_eq!(
            lines,
            vec![AuditLine::Repeated {
                identity: "agent:n9".into(),
                kind: "request",
                count: 999,
                reason: "no 999".into(),
                over_ms: WINDOW_MS
            }]
        );
        // The pairs with no repeat close without a line.
        lines.clear();
        audit.flush(2_000 + WINDOW_MS, &mut lines);
        assert!(lines.is_empty());
        assert_eq!(audit.tracked(), 0);
        // A new window starts with a first line again.
        audit.refused("agent:n9", "request", "again", 3 * WINDOW_MS, &mut lines);
        assert!(matches!(&lines[0], AuditLine::First { reason, .. } if reason == "again"));
    }

    #[test]
    fn many_identities_share_one_key_past_the_bound() {
        let mut audit = RefusalAudit::default();
        let mut lines = Vec::new();
        for i in 0..MAX_KEYS + 500 {
            audit.refused(&format!("agent:n{i}"), "hello", "refused", 5, &mut lines);
        }
        assert_eq!(audit.tracked(), MAX_KEYS + 1);
        assert_eq!(lines.len(), MAX_KEYS + 1, "one first line each, one shared");
        lines.clear();
        audit.flush(5 + WINDOW_MS, &mut lines);
        assert_eq!(
            lines,
            vec![AuditLine::Repeated {
                identity: OVERFLOW.0.into(),
                kind: OVERFLOW.1,
                count: 499,
                reason: "refused".into(),
                over_ms: WINDOW_MS
            }]
        );
    }
}
