//! Validation of rollcall (R12): the deterministic fleet-scale simulation and
//! the real-process fault harness, their scenario files, reports and plots.
//!
//! Role: produce the evidence for the deadlines of R5 from traffic timelines.
//! The simulator must drive the same state machines the binaries run, never a
//! re-implementation of them.
//!
//! Built by the chaos and simulation issues; this crate holds no code yet.
