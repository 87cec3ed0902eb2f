//! Whether the agents served a stale copy degraded exactly while it was
//! past its maximum age (README, "Stale copies"): every resolve answer a
//! run sampled says its copy's age and whether it was degraded, and under
//! `staleness.behaviour = "degrade"` the two must agree — degraded when the
//! age is past the maximum, whole when it is not — from the moment the age
//! passes until the arbiter confirms the copy again. Judged only by
//! scenarios that set `[pass] degraded_max_age_ms`.

use serde::{Deserialize, Serialize};

/// One agent's resolve answer as to staleness at a moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleAnswer {
    /// When it was sampled, ms since the run started.
    pub t_ms: u64,
    /// The agent.
    pub agent: String,
    /// The copy's age it gave.
    pub age_ms: u64,
    /// Whether it said it was degraded.
    pub degraded: bool,
    /// Whether, degraded, it served the whole copy because no endpoint had
    /// fresh local evidence.
    pub fallback: bool,
}

/// What the sampled answers showed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DegradedFigures {
    /// Answers sampled.
    pub answers: u64,
    /// Of those, past the maximum age.
    pub past_max_age: u64,
    /// Of those, served degraded.
    pub degraded: u64,
    /// Of those, served whole because no endpoint had fresh local evidence
    /// (gossip saw none of their nodes).
    pub fallback: u64,
    /// Answers whose `degraded` disagreed with their age.
    pub mismatched: u64,
    /// The first of them, in words.
    pub first_mismatch: Option<String>,
    /// Agents running at the end whose last answer was still degraded
    /// (the copy never confirmed again before the run ended).
    pub still_degraded_at_end: Vec<String>,
}

/// The figures of `answers` (in any order) for a maximum age of
/// `max_age_ms`; the agents in `down_at_end` (crashed, not restarted) have
/// no last answer to judge.
pub fn figures(
    answers: &[StaleAnswer],
    max_age_ms: u64,
    down_at_end: &[String],
) -> DegradedFigures {
    let mut sorted: Vec<&StaleAnswer> = answers.iter().collect();
    sorted.sort_by_key(|a| a.t_ms);
    let mut f = DegradedFigures {
        answers: sorted.len() as u64,
        ..DegradedFigures::default()
    };
    let mut last: std::collections::BTreeMap<&str, bool> = Default::default();
    for a in sorted {
        let past = a.age_ms > max_age_ms;
        f.past_max_age += u64::from(past);
        f.degraded += u64::from(a.degraded);
        f.fallback += u64::from(a.degraded && a.fallback);
        if past != a.degraded {
            f.mismatched += 1;
            f.first_mismatch.get_or_insert_with(|| {
                format!(
                    "{} at {} ms: age {} ms, degraded {}",
                    a.agent, a.t_ms, a.age_ms, a.degraded
                )
            });
        }
        last.insert(&a.agent, a.degraded);
    }
    f.still_degraded_at_end = last
        .into_iter()
        .filter(|(agent, degraded)| *degraded && !down_at_end.iter().any(|d| d == agent))
        .map(|(agent, _)| agent.to_owned())
        .collect();
    f
}

/// The failures of `figures` (`None`: nothing was sampled).
pub fn judge(figures: Option<&DegradedFigures>, failures: &mut Vec<String>) {
    let Some(f) = figures.filter(|f| f.answers > 0) else {
        failures.push(
            "no resolve answer was sampled, so degraded answers were not measured".to_owned(),
        );
        return;
    };
    if f.past_max_age == 0 {
        failures.push(format!(
            "none of the {} answers sampled was past its maximum age: the run never exercised degrade",
            f.answers
        ));
    }
    if f.mismatched > 0 {
        failures.push(format!(
            "{} answers said degraded when their age did not, or the other way round (first: {})",
            f.mismatched,
            f.first_mismatch.as_deref().unwrap_or("?")
        ));
    }
    if f.fallback > 0 {
        failures.push(format!(
            "{} degraded answers found no endpoint with fresh local evidence and served the whole copy (is the zone's gossip running?)",
            f.fallback
        ));
    }
    if !f.still_degraded_at_end.is_empty() {
        failures.push(format!(
            "still degraded when the run ended: {}",
            f.still_degraded_at_end.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(t_ms: u64, agent: &str, age_ms: u64, degraded: bool) -> StaleAnswer {
        StaleAnswer {
            t_ms,
            agent: agent.into(),
            age_ms,
            degraded,
            fallback: false,
        }
    }

    #[test]
    fn agreeing_answers_pass_and_each_disagreement_is_named() {
        let good = [
            answer(0, "a", 0, false),
            answer(100, "a", 6_000, true),
            answer(200, "a", 0, false),
        ];
        let f = figures(&good, 5_000, &[]);
        assert_eq!(
            (f.answers, f.past_max_age, f.degraded, f.mismatched),
            (3, 1, 1, 0)
        );
        let mut failures = Vec::new();
        judge(Some(&f), &mut failures);
        assert!(failures.is_empty(), "{failures:?}");

        let bad = [
            answer(0, "a", 6_000, false),
            answer(100, "b", 100, true),
            answer(200, "c", 6_000, true),
        ];
        let f = figures(&bad, 5_000, &[]);
        assert_eq!(f.mismatched, 2);
        assert_eq!(f.still_degraded_at_end, ["b", "c"]);
        // A crashed agent's last answer is not judged.
        let f = figures(&bad, 5_000, &["c".to_owned()]);
        assert_eq!(f.still_degraded_at_end, ["b"]);
        let mut failures = Vec::new();
        judge(Some(&f), &mut failures);
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(failures[0].contains("a at 0 ms"), "{failures:?}");

        let mut whole = answer(100, "a", 6_000, true);
        whole.fallback = true;
        let f = figures(&[whole, answer(200, "a", 0, false)], 5_000, &[]);
        assert_eq!(f.fallback, 1);
        let mut failures = Vec::new();
        judge(Some(&f), &mut failures);
        assert_eq!(failures.len(), 1, "{failures:?}");
    }

    #[test]
    fn nothing_sampled_or_nothing_stale_measured_nothing() {
        let mut failures = Vec::new();
        judge(None, &mut failures);
        judge(
            Some(&figures(&[answer(0, "a", 0, false)], 5_000, &[])),
            &mut failures,
        );
        assert_eq!(failures.len(), 2, "{failures:?}");
    }
}
