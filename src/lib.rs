//! The `rollcall` package: the one binary (`src/main.rs`, a thin CLI) and
//! the development launchers it and the cross-crate tests share. Nothing
//! here is for production: `dev` and `dev_regions` put whole clusters in
//! one process with throwaway certificates; `inspect` renders what the
//! read-only operator commands fetch from an agent.

pub mod dev;
pub mod dev_regions;
pub mod inspect;
pub mod targets;
