//! Hand-built snapshots for the diagnosis tests: a trace written event by event (allocations,
//! frees, OOMs, the optimizer's record_function ranges) and blocks from before the window, in
//! the JSON form of the dict `_dump_snapshot` pickles.

#![allow(dead_code)]

use serde_json::{json, Value as Json};
use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::report::{DeviceReport, FileReport, LiveAllocation};

/// Frames, innermost first, as `(file, function)`.
pub type Stack<'a> = &'a [(&'a str, &'a str)];

pub const MODULE: &str = "/venv/site-packages/torch/nn/modules/module.py";

/// A module forward in a training script.
pub const FORWARD: Stack = &[
    ("/home/me/model.py", "forward"),
    (MODULE, "_call_impl"),
    ("/home/me/train.py", "train_step"),
    ("/home/me/train.py", "main"),
];
/// `loss.backward()` on the main thread (its root gradient).
pub const BACKWARD_CALL: Stack = &[
    ("/venv/site-packages/torch/autograd/__init__.py", "backward"),
    ("/venv/site-packages/torch/_tensor.py", "backward"),
    ("/home/me/train.py", "train_step"),
];
/// autograd's thread with `stacks="all"`: the gradient of a parameter.
pub const ACCUMULATE_GRAD: Stack = &[
    ("??", "torch::autograd::AccumulateGrad::accumulateGrad(...)"),
    ("??", "torch::autograd::Engine::evaluate_function(...)"),
    ("??", "torch::autograd::Engine::thread_main(...)"),
];
/// Adam's first step creating its state.
pub const ADAM_INIT: Stack = &[
    ("/venv/site-packages/torch/optim/adam.py", "_init_group"),
    ("/venv/site-packages/torch/optim/adam.py", "step"),
    ("/venv/site-packages/torch/optim/optimizer.py", "wrapper"),
    ("/home/me/train.py", "train_step"),
];
/// Adam's update kernels (their temporaries).
pub const ADAM_UPDATE: Stack = &[
    (
        "/venv/site-packages/torch/optim/adam.py",
        "_multi_tensor_adam",
    ),
    ("/venv/site-packages/torch/optim/adam.py", "step"),
    ("/home/me/train.py", "train_step"),
];
pub const ZERO_GRAD: Stack = &[
    ("/venv/site-packages/torch/optim/optimizer.py", "zero_grad"),
    ("/home/me/train.py", "train_step"),
];
/// Loading with `model.to("cuda")`.
pub const LOAD: Stack = &[
    (MODULE, "convert"),
    (MODULE, "_apply"),
    (MODULE, "to"),
    ("/home/me/train.py", "main"),
];
/// A module forward in a serving script: no frame says no_grad or generation.
pub const SERVE_FORWARD: Stack = &[
    ("/home/me/model.py", "forward"),
    (MODULE, "_call_impl"),
    ("/home/me/serve.py", "handle"),
];
/// HF generation's sampling step.
pub const GENERATE: Stack = &[
    (
        "/venv/site-packages/transformers/generation/utils.py",
        "_sample",
    ),
    (
        "/venv/site-packages/transformers/generation/utils.py",
        "generate",
    ),
    ("/home/me/serve.py", "handle"),
];
/// No frames (autograd's thread with `stacks="python"`, or a run without stacks).
pub const NONE: Stack = &[];

pub fn frames(stack: Stack) -> Json {
    stack
        .iter()
        .map(|(file, name)| json!({"filename": file, "line": 1, "name": name}))
        .collect()
}

/// A snapshot under construction. Addresses are handed out from separate ranges for traced
/// allocations and for blocks from before the window; every event is 1 µs after the last.
pub struct Snapshot {
    trace: Vec<Json>,
    annotations: Vec<Json>,
    ghosts: Vec<Json>,
    time: i64,
    next_address: u64,
    next_ghost: u64,
    /// Size of each live traced allocation, by address.
    sizes: std::collections::HashMap<u64, u64>,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            trace: Vec::new(),
            annotations: Vec::new(),
            ghosts: Vec::new(),
            time: 1000,
            next_address: 0x7f00_0000_0000,
            next_ghost: 0x7e00_0000_0000,
            sizes: Default::default(),
        }
    }
}

/// Rounded up to 2 MiB: addresses never overlap.
fn span(size: u64) -> u64 {
    size.div_ceil(2 << 20).max(1) * (2 << 20)
}

impl Snapshot {
    fn event(&mut self, action: &str, addr: u64, size: u64, stack: Stack) {
        self.time += 1;
        self.trace.push(
            json!({"action": action, "addr": addr, "size": size, "stream": 0,
                               "time_us": self.time, "frames": frames(stack)}),
        );
    }

    /// The number the next event will have.
    pub fn next_event(&self) -> u32 {
        self.trace.len() as u32
    }

    /// Allocates `size` bytes; returns the address.
    pub fn alloc(&mut self, size: u64, stack: Stack) -> u64 {
        let addr = self.next_address;
        self.next_address += span(size);
        self.event("alloc", addr, size, stack);
        self.sizes.insert(addr, size);
        addr
    }

    /// Frees the allocation at `addr` (`free_requested`, then `free_completed`).
    pub fn free(&mut self, addr: u64, stack: Stack) {
        let size = self.sizes.remove(&addr).expect("a live allocation");
        self.event("free_requested", addr, size, stack);
        self.event("free_completed", addr, size, stack);
    }

    pub fn oom(&mut self, size: u64, stack: Stack) {
        self.event("oom", 0, size, stack);
    }

    /// Opens or closes a record_function range (`Optimizer.step#Adam.step`, …).
    pub fn annotate(&mut self, name: &str, stage: &str) {
        self.time += 1;
        self.annotations
            .push(json!({"name": name, "stage": stage, "device": 0, "time_us": self.time}));
    }

    /// A block allocated before the window and still allocated at the dump.
    pub fn before_window(&mut self, size: u64, stack: Stack) -> u64 {
        let addr = self.next_ghost;
        self.next_ghost += span(size);
        self.ghosts.push(json!({
            "device": 0, "address": addr, "total_size": span(size),
            "allocated_size": size, "active_size": size, "requested_size": size,
            "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
            "is_expandable": false, "frames": [],
            "blocks": [
                {"address": addr, "size": size, "requested_size": size,
                 "state": "active_allocated", "frames": frames(stack)},
                {"address": addr + size, "size": span(size) - size, "requested_size": 0,
                 "state": "inactive", "frames": []},
            ],
        }));
        addr
    }

    pub fn json(&self) -> Json {
        json!({
            "segments": self.ghosts,
            "device_traces": [self.trace],
            "external_annotations": self.annotations,
        })
    }

    /// The report of device 0.
    pub fn report(&self, name: &str) -> DeviceReport {
        report_of_json(name, &self.json()).devices.remove(0)
    }
}

/// A snapshot in its JSON form, written to a scratch file.
pub fn write_json(name: &str, doc: &Json) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("snapscan-synthetic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(doc).unwrap()).unwrap();
    path
}

/// A snapshot in its JSON form, written to a scratch file and reported.
pub fn report_of_json(name: &str, doc: &Json) -> FileReport {
    let path = write_json(name, doc);
    let loaded = snapscan::snapshot::load(&path).unwrap_or_else(|e| panic!("{e}"));
    file_report(&loaded, &ReportOptions::default())
}

/// The allocation alive at the peak at `addr`.
pub fn live_at(dev: &DeviceReport, addr: u64) -> &LiveAllocation {
    dev.live_at_peak
        .iter()
        .find(|a| a.address == addr)
        .unwrap_or_else(|| panic!("no allocation at {addr:#x} alive at the peak"))
}

/// Category and confidence of the allocation alive at the peak at `addr`.
pub fn category_at(dev: &DeviceReport, addr: u64) -> (&str, &str) {
    let a = live_at(dev, addr);
    (a.category.as_ref(), a.confidence.as_ref())
}
