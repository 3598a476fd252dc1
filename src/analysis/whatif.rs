//! `snapscan whatif`: the run replayed through the allocator model under a change (settings,
//! capacity, request sizes), side by side with the real run, and the model's identity check.

use rustc_hash::FxHashMap;

use super::allocator_replay::settings_out;
use super::callsite::CallSites;
use super::category::{Categorizer, Category};
use super::lifetimes::replay_device;
use super::phase::{find_phases, Phase, Phases};
use crate::allocator::{self, rules, Changes, Outcome, Settings, Simulation};
use crate::report::whatif::*;
use crate::snapshot::{Action, Snapshot};
use crate::units::format_bytes;

/// What the user asked to change.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// `PYTORCH_CUDA_ALLOC_CONF` text over the dump's settings.
    pub set: Option<String>,
    /// Bytes PyTorch may reserve.
    pub capacity: Option<u64>,
    /// A card from [`GPUS`] (its memory less a CUDA context).
    pub gpu: Option<String>,
    /// `(category or "batch", factor)`.
    pub scales: Vec<(String, f64)>,
    /// Call sites (as the report names them) or globs: their requests are removed.
    pub drops: Vec<String>,
    /// `8bit` (1 byte per optimizer value instead of 4) or `paged` (state off the device).
    pub optimizer: Option<String>,
    /// Bisect for the largest batch factor (or, with no size change asked, the smallest
    /// capacity) at which the run fits.
    pub search: bool,
    pub full: bool,
}

/// Cards and the memory `torch.cuda.get_device_properties(d).total_memory` reports for them
/// (the H200's from this project's captures; the others as commonly reported, within a few
/// MiB, which ECC and driver versions move).
pub const GPUS: &[(&str, u64)] = &[
    ("A100-40GB", 42_298_834_944),
    ("A100-80GB", 85_095_874_560),
    ("H100-80GB", 85_045_870_592),
    ("H200", 150_109_880_320),
    ("L4", 23_659_151_360),
    ("A10G", 23_836_229_632),
    ("RTX4090", 25_393_692_672),
    ("RTX3090", 25_438_715_904),
    ("T4", 15_835_660_288),
    ("V100-16GB", 16_945_709_056),
    ("V100-32GB", 34_089_730_048),
];

/// What a CUDA context takes of a card before PyTorch reserves anything (typical, varies
/// with the driver and the libraries loaded).
pub const CUDA_CONTEXT: u64 = 500 << 20;

pub fn gpu_capacity(name: &str) -> Result<u64, String> {
    let want: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_uppercase();
    GPUS.iter()
        .find(|(n, _)| {
            n.chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .collect::<String>()
                .eq_ignore_ascii_case(&want)
        })
        .map(|&(_, bytes)| bytes - CUDA_CONTEXT)
        .ok_or_else(|| {
            let names: Vec<&str> = GPUS.iter().map(|g| g.0).collect();
            format!("unknown GPU `{name}`; known: {}", names.join(", "))
        })
}

const SCALABLE: [&str; 7] = [
    "batch",
    "weights",
    "activations",
    "gradients",
    "optimizer_state",
    "temporary",
    "kv_cache",
];

/// Checks the request before any file is read.
/// `CATEGORY=FACTOR` (`batch=0.5`) as a [`Request::scales`] entry; the error names the text.
pub fn parse_scale(text: &str) -> Result<(String, f64), String> {
    let (what, f) = text
        .split_once('=')
        .ok_or_else(|| format!("{text}: expected CATEGORY=FACTOR"))?;
    let f: f64 = f
        .parse()
        .map_err(|_| format!("{text}: `{f}` is not a number"))?;
    Ok((what.to_owned(), f))
}

pub fn validate(req: &Request) -> Result<(), String> {
    for (what, f) in &req.scales {
        if !SCALABLE.contains(&what.as_str()) {
            return Err(format!(
                "--scale {what}: expected one of {}",
                SCALABLE.join(", ")
            ));
        }
        if !(f.is_finite() && *f >= 0.0 && *f <= 1000.0) {
            return Err(format!(
                "--scale {what}={f}: expected a factor from 0 to 1000"
            ));
        }
    }
    if let Some(o) = &req.optimizer {
        if o != "8bit" && o != "paged" {
            return Err(format!("--optimizer {o}: expected 8bit or paged"));
        }
    }
    if let Some(g) = &req.gpu {
        gpu_capacity(g)?;
    }
    if let Some(conf) = &req.set {
        Settings::default()
            .apply_conf(conf)
            .map_err(|e| e.to_string())?;
    }
    for d in &req.drops {
        glob::Pattern::new(d).map_err(|e| format!("--drop {d}: {e}"))?;
    }
    Ok(())
}

fn changes_text(req: &Request) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(s) = &req.set {
        out.push(format!("settings {s}"));
    }
    if let Some(c) = req.capacity {
        out.push(format!("capacity {}", format_bytes(c)));
    }
    if let Some(g) = &req.gpu {
        out.push(format!(
            "capacity of a {g} (less {} for the CUDA context)",
            format_bytes(CUDA_CONTEXT)
        ));
    }
    for (what, f) in &req.scales {
        out.push(format!("{what} × {f}"));
    }
    for d in &req.drops {
        out.push(format!("requests from {d} removed"));
    }
    if let Some(o) = &req.optimizer {
        out.push(match o.as_str() {
            "8bit" => "optimizer state in 8 bits (1 byte per value instead of 4)".to_owned(),
            _ => "optimizer state paged off the device".to_owned(),
        });
    }
    if out.is_empty() {
        out.push("no change (the model against the real run)".to_owned());
    }
    out
}

/// The limit the real run ran into. At an OOM the allocator had released what it could, so
/// what PyTorch could reserve was the reserved bytes then plus the device's free memory;
/// when the failed `cudaMalloc` was within the free memory, a per-process fraction set the
/// limit, which is at least the highest reserved level the run reached.
fn real_capacity(sim: &Simulation) -> Option<u64> {
    let o = sim.ooms.first()?;
    let free = o.device_free?;
    if o.segment_bytes > free {
        Some(
            o.why
                .reserved_bytes
                .saturating_add(free)
                .max(sim.peak_reserved.0),
        )
    } else {
        Some(sim.peak_reserved.0)
    }
}

fn peak_out(p: (u64, Option<u32>), phases: &Phases) -> PeakOut {
    PeakOut {
        bytes: p.0,
        event: p.1,
        phase: phases.at(p.1).name().to_owned(),
    }
}

/// What a size change reads of each alloc of the window: worked out once per device (a
/// lifetimes replay and the categorizer), then reused by every replay of a search.
pub struct AllocFacts {
    /// (alloc event, requested bytes, category, phase, stack).
    allocs: Vec<(u32, u64, Category, Phase, crate::snapshot::StackId)>,
    /// OOM events and their requests.
    ooms: Vec<(u32, u64)>,
}

impl AllocFacts {
    fn new(snapshot: &Snapshot, device: i64, phases: &Phases) -> AllocFacts {
        let replay = replay_device(snapshot, device);
        let categorizer = Categorizer::new(snapshot, phases, &replay);
        let allocs = replay
            .allocations
            .values()
            .filter_map(|a| {
                let event = a.alloc_event?;
                let category = categorizer.claim(&a).category;
                Some((
                    event,
                    a.requested_bytes,
                    category,
                    phases.at(Some(event)),
                    a.stack,
                ))
            })
            .collect();
        let ooms = snapshot
            .trace(device)
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == Action::Oom)
            .map(|(i, e)| (i as u32, e.size))
            .collect();
        AllocFacts { allocs, ooms }
    }
}

/// New request sizes by event for the size changes asked.
fn sizes_for(
    snapshot: &Snapshot,
    facts: &std::sync::OnceLock<AllocFacts>,
    device: i64,
    phases: &Phases,
    req: &Request,
) -> FxHashMap<u32, u64> {
    let mut sizes = FxHashMap::default();
    if req.scales.is_empty() && req.drops.is_empty() && req.optimizer.is_none() {
        return sizes;
    }
    let facts = facts.get_or_init(|| AllocFacts::new(snapshot, device, phases));
    let sites = CallSites::new(&snapshot.interner);
    let drops: Vec<glob::Pattern> = req
        .drops
        .iter()
        .filter_map(|d| glob::Pattern::new(d).ok())
        .collect();
    let batch = |phase: Phase| matches!(phase, Phase::Forward | Phase::Backward);
    for &(event, requested, category, phase, stack) in &facts.allocs {
        let mut f = 1.0f64;
        for (what, factor) in &req.scales {
            let hit = if what == "batch" {
                batch(phase) && matches!(category, Category::Activations | Category::Temporary)
            } else {
                category.name() == what
            };
            if hit {
                f *= factor;
            }
        }
        if category == Category::OptimizerState {
            match req.optimizer.as_deref() {
                Some("8bit") => f *= 0.25,
                Some(_) => f = 0.0,
                None => {}
            }
        }
        if !drops.is_empty() {
            if let Some(site) = sites.of(stack) {
                if drops
                    .iter()
                    .any(|p| p.matches(&site) || p.as_str() == &*site)
                {
                    f = 0.0;
                }
            }
        }
        if f != 1.0 {
            sizes.insert(event, (requested as f64 * f).ceil() as u64);
        }
    }
    // The request that failed: its category is unknown; a batch change scales it in the
    // forward and backward passes.
    if let Some(f) = req.scales.iter().find(|(w, _)| w == "batch").map(|s| s.1) {
        for &(i, size) in &facts.ooms {
            if batch(phases.at(Some(i))) {
                sizes.insert(i, (size as f64 * f).ceil() as u64);
            }
        }
    }
    sizes
}

fn scenario(
    settings: &Settings,
    capacity: Option<u64>,
    outcome: &Outcome,
    phases: &Phases,
    full: bool,
) -> Scenario {
    Scenario {
        settings: settings_out(settings),
        capacity_bytes: capacity,
        peak_allocated: peak_out(outcome.peak_allocated, phases),
        peak_reserved: peak_out(outcome.peak_reserved, phases),
        ooms: outcome
            .ooms
            .iter()
            .map(|o| OomFit {
                event: o.event,
                fits: o.fits,
                margin_bytes: o.margin,
                real: o.real,
                request_bytes: o.rounded,
            })
            .collect(),
        first_oom_event: outcome.first_oom_event,
        reserved_curve: full.then(|| outcome.reserved_curve.clone()),
    }
}

/// The trace's segment changes, each at the event whose request or `empty_cache` made it
/// (the first event after it that is not a segment event).
fn real_segment_changes(snapshot: &Snapshot, device: i64) -> Vec<(u32, i64)> {
    let trace = snapshot.trace(device);
    let mut out = Vec::new();
    let mut waiting: Vec<i64> = Vec::new();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                waiting.push(allocator::whatif::signed(e.size))
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                waiting.push(-allocator::whatif::signed(e.size))
            }
            _ => out.extend(waiting.drain(..).map(|d| (i as u32, d))),
        }
    }
    out.extend(waiting.drain(..).map(|d| (trace.len() as u32, d)));
    out
}

fn identity(snapshot: &Snapshot, device: i64, sim: &Simulation, outcome: &Outcome) -> Identity {
    let mut real = real_segment_changes(snapshot, device);
    let mut model = outcome.segment_changes.clone();
    real.sort_unstable();
    model.sort_unstable();
    let (mut i, mut j, mut matched) = (0, 0, 0u64);
    let mut first: Option<String> = None;
    while i < real.len() && j < model.len() {
        match real[i].cmp(&model[j]) {
            std::cmp::Ordering::Equal => {
                matched += 1;
                i += 1;
                j += 1;
            }
            std::cmp::Ordering::Less => {
                first.get_or_insert_with(|| {
                    format!(
                        "event {}: the real run changed reserved by {} bytes, the model did not",
                        real[i].0, real[i].1
                    )
                });
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                first.get_or_insert_with(|| {
                    format!(
                        "event {}: the model changed reserved by {} bytes, the real run did not",
                        model[j].0, model[j].1
                    )
                });
                j += 1;
            }
        }
    }
    if let Some(r) = real.get(i) {
        first.get_or_insert_with(|| {
            format!(
                "event {}: the real run changed reserved by {} bytes, the model did not",
                r.0, r.1
            )
        });
    } else if let Some(m) = model.get(j) {
        first.get_or_insert_with(|| {
            format!(
                "event {}: the model changed reserved by {} bytes, the real run did not",
                m.0, m.1
            )
        });
    }
    let real_ooms: Vec<u32> = sim.ooms.iter().map(|o| o.event).collect();
    let reproduced = outcome
        .ooms
        .iter()
        .filter(|o| o.real && !o.fits && real_ooms.contains(&o.event))
        .count() as u64;
    if first.is_none() {
        if let Some(o) = outcome.ooms.iter().find(|o| !o.real) {
            first = Some(format!(
                "event {}: the model ran out of memory where the real run did not",
                o.event
            ));
        }
    }
    Identity {
        segment_changes_real: real.len() as u64,
        segment_changes_matched: matched,
        ooms_reproduced: reproduced,
        ooms_real: sim.oom_count,
        first_difference: first,
    }
}

pub fn whatif_file(
    path: &str,
    snapshot: &Snapshot,
    device: Option<i64>,
    req: &Request,
) -> WhatifFile {
    let devices: Vec<i64> = snapshot
        .devices()
        .into_iter()
        .filter(|d| device.is_none_or(|want| want == *d))
        .filter(|d| !snapshot.trace(*d).is_empty())
        .collect();
    use rayon::prelude::*;
    let devices = devices
        .par_iter()
        .map(|&d| whatif_device(snapshot, d, req))
        .collect();
    WhatifFile {
        path: path.to_owned(),
        devices,
    }
}

/// What every what-if of one device starts from: the exact replay of the real run, its
/// phases, the limit it ran into and the pools of its requests.
pub struct Base<'a> {
    snapshot: &'a Snapshot,
    device: i64,
    pub real_settings: Settings,
    pub notes: Vec<String>,
    pub sim: Simulation,
    pub phases: Phases,
    pub real_capacity: Option<u64>,
    facts: std::sync::OnceLock<AllocFacts>,
}

impl<'a> Base<'a> {
    pub fn new(snapshot: &'a Snapshot, device: i64) -> Base<'a> {
        let (real_settings, _) = Settings::from_snapshot(snapshot);
        let (sim, phases) = rayon::join(
            || allocator::simulate(snapshot, device, &real_settings, &Default::default()),
            || find_phases(snapshot, device),
        );
        Base::from_sim(snapshot, device, sim, phases)
    }

    /// The base of a replay already made (the report's, at its OOMs: the first OOM, which the
    /// limit is read at, is always among them).
    pub fn from_sim(
        snapshot: &'a Snapshot,
        device: i64,
        sim: Simulation,
        phases: Phases,
    ) -> Base<'a> {
        let (real_settings, notes) = Settings::from_snapshot(snapshot);
        let real_capacity = real_capacity(&sim);
        Base {
            snapshot,
            device,
            real_settings,
            notes,
            sim,
            phases,
            real_capacity,
            facts: std::sync::OnceLock::new(),
        }
    }

    /// The settings, capacity and changes of a request.
    fn changes(&self, req: &Request) -> (Settings, Option<u64>, Changes) {
        let mut settings = self.real_settings.clone();
        if let Some(conf) = &req.set {
            // Checked in `validate`.
            let _ = settings.apply_conf(conf);
        }
        let capacity = match (&req.gpu, req.capacity) {
            (_, Some(c)) => Some(c),
            (Some(g), None) => gpu_capacity(g).ok(),
            (None, None) => self.real_capacity,
        };
        let changes = Changes {
            sizes: sizes_for(self.snapshot, &self.facts, self.device, &self.phases, req),
            capacity,
            pools: self.sim.private_allocs.clone(),
            follow_releases: capacity.is_none(),
        };
        (settings, capacity, changes)
    }

    /// One replay under a request.
    pub fn outcome(&self, req: &Request) -> Outcome {
        let (settings, _, changes) = self.changes(req);
        allocator::whatif(self.snapshot, self.device, &settings, &changes)
    }
}

/// The what-if of one device, with its real run and the identity check.
pub fn whatif_device(snapshot: &Snapshot, device: i64, req: &Request) -> WhatifDevice {
    let base = Base::new(snapshot, device);
    let sim = &base.sim;
    let phases = &base.phases;
    let real_settings = &base.real_settings;
    let real_cap = base.real_capacity;
    let mut notes = base.notes.clone();
    let same = Changes {
        sizes: FxHashMap::default(),
        capacity: real_cap,
        pools: sim.private_allocs.clone(),
        follow_releases: real_cap.is_none(),
    };
    let (model_real, (settings, capacity, changes, outcome)) = rayon::join(
        || allocator::whatif(snapshot, device, real_settings, &same),
        || {
            let (settings, capacity, changes) = base.changes(req);
            let outcome = allocator::whatif(snapshot, device, &settings, &changes);
            (settings, capacity, changes, outcome)
        },
    );
    let identity = identity(snapshot, device, sim, &model_real);

    let mut real = scenario(real_settings, real_cap, &model_real, phases, true);
    // The real run's reserved bytes as the trace has them.
    let start_reserved = sim.start.reserved_bytes;
    let mut level = allocator::whatif::signed(start_reserved);
    let mut curve: Vec<(u32, u64)> = Vec::new();
    for (e, d) in real_segment_changes(snapshot, device) {
        level = level.saturating_add(d);
        let v = level.max(0) as u64;
        match curve.last_mut() {
            Some(last) if last.0 == e => last.1 = v,
            _ => curve.push((e, v)),
        }
    }
    real.reserved_curve = Some(curve);
    // The real run's own figures: the exact replay's peaks and the trace's OOMs.
    real.peak_allocated = peak_out(sim.peak_allocated, phases);
    real.peak_reserved = peak_out(sim.peak_reserved, phases);
    real.ooms = sim
        .ooms
        .iter()
        .map(|o| OomFit {
            event: o.event,
            fits: false,
            margin_bytes: match real_cap {
                Some(c) => allocator::whatif::margin(
                    c,
                    o.why.reserved_bytes.saturating_add(o.segment_bytes),
                ),
                None => 0,
            },
            real: true,
            request_bytes: o.rounded,
        })
        .collect();
    real.first_oom_event = sim.ooms.first().map(|o| o.event);

    if real_cap.is_none() && capacity.is_none() {
        notes.push(
            "the run did not run out of memory and no capacity was given (--capacity, --gpu): \
             the what-if has no limit, so it gives peaks but no OOM"
                .to_owned(),
        );
    }
    if req.scales.iter().any(|(w, _)| w == "batch") {
        notes.push(
            "a batch factor scales the activations and temporaries of the forward and backward \
             passes; a smaller batch also changes how many steps run, which the trace cannot know"
                .to_owned(),
        );
    }
    if settings.garbage_collection_threshold > 0.0 {
        notes.push(
            "garbage_collection_threshold acts under a per-process memory fraction, which the \
             what-if does not model: its releases are not made"
                .to_owned(),
        );
    }
    let search = req
        .search
        .then(|| search(&base, req, &settings, capacity, &changes));
    WhatifDevice {
        device,
        events: snapshot.trace(device).len() as u64,
        real_start_reserved: start_reserved,
        changes: changes_text(req),
        whatif: scenario(&settings, capacity, &outcome, phases, true),
        real,
        identity,
        search,
        notes,
    }
}

fn fits(o: &Outcome) -> bool {
    o.ooms.iter().all(|o| o.fits)
}

/// Bisection over replays: the largest batch factor that fits (with the other changes), or
/// without size changes the smallest capacity that fits.
fn search(
    base: &Base,
    req: &Request,
    settings: &Settings,
    capacity: Option<u64>,
    changes: &Changes,
) -> SearchOut {
    let (snapshot, device) = (base.snapshot, base.device);
    const STEPS: u32 = 12;
    if capacity.is_some() {
        let run = |f: f64| {
            let mut r = req.clone();
            r.scales.retain(|(w, _)| w != "batch");
            r.scales.push(("batch".to_owned(), f));
            let c = Changes {
                sizes: sizes_for(snapshot, &base.facts, device, &base.phases, &r),
                ..changes.clone()
            };
            fits(&allocator::whatif(snapshot, device, settings, &c))
        };
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        let mut replays = 0;
        if run(hi) {
            // Fits as it is: how much larger could the batch be?
            lo = 1.0;
            hi = 16.0;
            replays += 1;
        }
        let mut found = (lo > 0.0).then_some(lo);
        for _ in 0..STEPS {
            let mid = (lo + hi) / 2.0;
            replays += 1;
            if run(mid) {
                lo = mid;
                found = Some(mid);
            } else {
                hi = mid;
            }
        }
        return SearchOut {
            what: "batch".to_owned(),
            value: found.map(|f| (f * 1000.0).floor() / 1000.0),
            replays,
        };
    }
    // The smallest capacity that fits: between nothing and the reserved peak with no limit.
    let free = Changes {
        capacity: None,
        ..changes.clone()
    };
    let unlimited = allocator::whatif(snapshot, device, settings, &free);
    let (mut lo, mut hi) = (0u64, unlimited.peak_reserved.0.max(rules::SMALL_BUFFER));
    let mut replays = 1;
    for _ in 0..STEPS + 8 {
        if hi - lo <= rules::ROUND_LARGE {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        replays += 1;
        let c = Changes {
            capacity: Some(mid),
            ..changes.clone()
        };
        if fits(&allocator::whatif(snapshot, device, settings, &c)) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    SearchOut {
        what: "capacity".to_owned(),
        value: Some(hi as f64),
        replays,
    }
}
