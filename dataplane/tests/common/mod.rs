//! Shared by the integration tests of this crate. Each test binary compiles this module
//! with `mod common;` and uses only a part of it, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod rds;
