//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`),
//! replayed over a snapshot's trace: where each block goes, when a segment is needed, and why
//! a request did not fit. It reads only the typed snapshot; the analysis and the pictures read
//! it. (`analysis::lifetimes` is another thing: when each allocation lived, and the curves.)

pub mod fit;
pub mod rules;
pub mod settings;
mod sim;
mod start;
pub mod state;
pub mod whatif;

pub use fit::{Holder, Pinner, SplitSegment, Unusable, WhyNoFit};
pub use settings::{Settings, SettingsError};
pub use sim::{
    simulate, state_after, Divergence, EndCheck, OomReplay, Options, Rule, SegmentCounts,
    Simulation, UnfitMalloc,
};
pub use start::StartInfo;
pub use whatif::{whatif, Changes, Outcome, WhatifOom};
