//! Shared helpers for the integration test binaries: `mod support;` in each one.
//!
//! Every test binary compiles its own copy and uses only part of it, so unused
//! helpers must not warn.
#![allow(dead_code, unused_imports)]

pub mod conformance;
pub mod counters_only;
pub mod counting;
pub mod down;
pub mod redis;
