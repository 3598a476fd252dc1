//! One integration-test binary; each module covers one capability.

mod common;
mod explain;
mod svg;
