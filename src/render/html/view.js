// snapscan view: the page's script (embedded by src/render/html/mod.rs; no request of any kind).
//
// Data: <script class="snapscan-data"> elements hold gzip chunks in base64. Inflated and joined
// they are one blob: a u32 (little-endian) header length, the header (JSON), then the columns
// of every device, each at [offset, length] given by header.devices[i].columns (see data.rs):
// LEB128 varints, `zz` = zigzag-encoded signed deltas.
//   allocations, in order of birth state: birth (delta), life (end - birth), req, blk (zz of
//   block - requested), addr (zz delta), stack, stream, pend (end - pending start + 1, 0 = none),
//   flags (bytes: category | confidence << 3 | origin << 5);
//   events: time (zz delta of µs since the first timed event);
//   segments, by address: seg_addr (zz delta), seg_size, seg_stream, seg_pool, seg_kind (bytes:
//   0 small, 1 large, 2 unknown, | 4 expandable), seg_first, seg_span (last - first state).
// A state k is the allocator after k events (0 = window start); an allocation is alive at k when
// birth <= k < end.
'use strict';
(function () {
  // Allocations drawn one by one in a view: at any one state at most 1000 allocations of
  // 0.1 % of the peak or more are alive, so zoomed into a state every one of them is drawn.
  const K_DRAW = 1000;
  const CHECK = 64; // states per block of the level sweep's summaries
  const M = { left: 78, right: 16, top: 26, plot: 380, band: 16, axis: 34, host: 84 };
  const UNKNOWN_PHASE = 5;
  const MAX_TABS = 16; // more panels than this: a list to pick from instead of tabs
  const ABBREV = { forward: 'fwd', backward: 'bwd', optimizer: 'opt', unknown: '?' };

  // ---------- formatting ----------
  function fmtBytes(b) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let v = Math.abs(b), u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    // As the report writes sizes (units.rs format_bytes).
    const s = v.toFixed(1);
    return (b < 0 ? '-' : '') + s + units[u];
  }
  function fmtExact(b) { return fmtBytes(b) + ' (' + Math.round(b).toLocaleString('en-US') + ' bytes)'; }
  function fmtInt(v) { return Math.round(v).toLocaleString('en-US'); }
  function hex(v) { return '0x' + Math.round(v).toString(16); }
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === 'class') e.className = attrs[k];
      else if (k === 'text') e.textContent = attrs[k];
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), attrs[k]);
      else e.setAttribute(k, attrs[k]);
    }
    for (const c of kids) if (c != null) e.append(c);
    return e;
  }
  // Whose code a stack is, as the report's call sites say it: "your code, via transformers →
  // torch.nn.functional.linear", "package code, from your train.py:40:main".
  const FRAME_CLASS = ['fc-user', 'fc-pkg', 'fc-rt'];
  const FRAME_TITLE = ['your code', 'a package (site-packages, dist-packages, a conda env)', 'the runtime (torch, C++, CPython)'];
  function codePathText(h, stack) {
    const k = h.stack_code ? h.stack_code[stack] : -1;
    if (k == null || k < 0) return '';
    const [cls, yours, via] = h.code_paths[k];
    const whose = cls === 'user' ? 'your code' : cls === 'package' ? (yours ? 'package code, from your ' + yours : 'package code only') : 'runtime code only';
    return via ? whose + ', via ' + via : whose;
  }

  // A frame's text with line-break opportunities after its slashes, colons and dots.
  function breakable(text) {
    const out = [];
    for (const part of text.split(/(?<=[/:.])/)) { out.push(part); out.push(document.createElement('wbr')); }
    return out;
  }
  function niceStep(span, ticks) {
    const raw = span / Math.max(1, ticks);
    const p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  function byteStep(max, ticks) {
    const raw = max / Math.max(1, ticks);
    let p = 1;
    while (p * 1024 <= raw) p *= 1024;
    for (const m of [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]) if (m * p >= raw) return m * p;
    return 1024 * p;
  }
  function lighter(hexColour, t) {
    const n = parseInt(hexColour.slice(1), 16);
    const mix = (c) => Math.round(c + (255 - c) * t);
    return 'rgb(' + mix(n >> 16) + ',' + mix((n >> 8) & 255) + ',' + mix(n & 255) + ')';
  }

  // ---------- decoding ----------
  async function inflate(text) {
    const bin = atob(text.trim());
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  // Reads `count` varints of bytes[off, off + len) into `out`; `mode` 1: running sum, 2: zigzag
  // running sum (the transforms are inline: a call per value would cost more than the decoding).
  // Two copies of the same loop, one per array type, so that each stays monomorphic.
  function varintsF64(bytes, off, len, count, out, mode) {
    let p = off, i = 0, acc = 0;
    const end = off + len;
    while (p < end && i < count) {
      let b = bytes[p++], v = b & 127;
      if (b >= 128) {
        let mul = 128;
        do { b = bytes[p++]; v += (b & 127) * mul; mul *= 128; } while (b >= 128 && p < end);
      }
      if (mode === 1) v = acc += v;
      else if (mode === 2) v = acc += v % 2 === 0 ? v / 2 : -(v + 1) / 2;
      out[i++] = v;
    }
    return out;
  }
  function varintsU32(bytes, off, len, count, out, mode) {
    let p = off, i = 0, acc = 0;
    const end = off + len;
    while (p < end && i < count) {
      let b = bytes[p++], v = b & 127;
      if (b >= 128) {
        let mul = 128;
        do { b = bytes[p++]; v += (b & 127) * mul; mul *= 128; } while (b >= 128 && p < end);
      }
      if (mode === 1) v = acc += v;
      out[i++] = v;
    }
    return out;
  }
  const POW2 = Float64Array.from({ length: 80 }, (_, e) => Math.pow(2, e - 2));
  // Quarter powers of two: 1 + 4 log2(v), 0 for nothing.
  // Colours of the per-pool reserved lines.
  const POOL_COLOURS = ['#1f6feb', '#d95f02', '#7570b3', '#e7298a', '#66a61e', '#a6761d'];
  function poolColour(i) { return POOL_COLOURS[i % POOL_COLOURS.length]; }
  function sizeClass(v) {
    if (v < 1) return 0;
    const e = v < 4294967296 ? 31 - Math.clz32(v) : 63 - Math.clz32(v / 4294967296);
    const frac = e >= 2 ? Math.floor(v / POW2[e]) & 3 : 0;
    return Math.min(255, 1 + e * 4 + frac);
  }

  // ---------- one device ----------
  class Device {
    constructor(h, blob, legend) {
      this.h = h;
      this.legend = legend;
      const n = (this.n = h.events);
      const N = (this.N = h.allocations);
      const col = (name, count, Arr, mode) => {
        const [off, len] = h.columns[name];
        return Arr === Float64Array ? varintsF64(blob, off, len, count, new Float64Array(count), mode) : varintsU32(blob, off, len, count, new Uint32Array(count), mode);
      };
      this.col = col;
      const raw = (name) => { const [off, len] = h.columns[name]; return blob.subarray(off, off + len); };
      const birth = (this.birth = col('birth', N, Uint32Array, 1));
      const end = (this.end = col('life', N, Uint32Array));
      for (let i = 0; i < N; i++) end[i] += birth[i];
      const req = (this.req = col('req', N, Float64Array));
      const blk = (this.blk = col('blk', N, Float64Array));
      for (let i = 0; i < N; i++) { const z = blk[i]; blk[i] = req[i] + (z % 2 === 0 ? z / 2 : -(z + 1) / 2); }
      this.addr = col('addr', N, Float64Array, 2);
      this.stack = col('stack', N, Uint32Array);
      // The user's annotations (_annotate_tensor), by allocation.
      this.annotation = new Map((h.annotations || []).map(([i, text]) => [i, text]));
      this.stream = col('stream', N, Uint32Array);
      const pend = (this.pend = col('pend', N, Uint32Array));
      for (let i = 0; i < N; i++) if (pend[i]) pend[i] = end[i] - pend[i] + 1;
      const flags = raw('flags');
      this.cat = new Uint8Array(N); this.conf = new Uint8Array(N); this.origin = new Uint8Array(N);
      for (let i = 0; i < N; i++) { const f = flags[i]; this.cat[i] = f & 7; this.conf[i] = (f >> 3) & 3; this.origin[i] = f >> 5; }
      this.times = null; // decoded on first use (see time())
      const S = (this.S = h.segments);
      this.sAddr = col('seg_addr', S, Float64Array, 2);
      this.sSize = col('seg_size', S, Float64Array);
      this.sStream = col('seg_stream', S, Uint32Array);
      this.sPool = col('seg_pool', S, Uint32Array);
      this.sFirst = col('seg_first', S, Uint32Array);
      this.sLast = col('seg_span', S, Uint32Array);
      for (let s = 0; s < S; s++) this.sLast[s] += this.sFirst[s];
      this.sKind = raw('seg_kind');
      // Phases: intervals [phase, step, first, last]; the phase of each allocation's birth.
      const ph = h.phases;
      this.phFirst = Int32Array.from(ph, (p) => p[2]);
      this.phLast = Int32Array.from(ph, (p) => p[3]);
      this.birthPhase = new Uint8Array(N);
      // (Births are in order: one walk along the intervals.)
      for (let i = 0, iv = 0; i < N; i++) {
        const e = this.birth[i] - 1;
        if (e < 0) { this.birthPhase[i] = UNKNOWN_PHASE; continue; }
        while (iv < ph.length && this.phLast[iv] < e) iv++;
        this.birthPhase[i] = iv < ph.length && this.phFirst[iv] <= e ? ph[iv][0] : UNKNOWN_PHASE;
      }
      // Deaths in order of end state (counting sort).
      const counts = new Uint32Array(n + 3);
      for (let i = 0; i < N; i++) counts[this.end[i] + 1]++;
      for (let k = 1; k < counts.length; k++) counts[k] += counts[k - 1];
      this.deathOrder = new Uint32Array(N);
      for (let i = 0; i < N; i++) this.deathOrder[counts[this.end[i]]++] = i;
      // Size classes (quarter powers of two) for picking the largest in a view.
      this.sizeClass = new Uint8Array(N);
      for (let i = 0; i < N; i++) this.sizeClass[i] = sizeClass(req[i]);
      // Reserved bytes as changes over the states.
      // (Sorted as packed keys state * SH + segment: a numeric sort, no comparator.)
      const SH = Math.pow(2, Math.ceil(Math.log2(S + 1)));
      const ups = new Float64Array(S), downs = new Float64Array(S);
      for (let s = 0; s < S; s++) { ups[s] = this.sFirst[s] * SH + s; downs[s] = (this.sLast[s] + 1) * SH + s; }
      ups.sort(); downs.sort();
      const segOf = (key) => key % SH;
      this.resState = new Float64Array(2 * S);
      this.resLevel = new Float64Array(2 * S);
      let lvl = 0, u = 0, w = 0, r = 0;
      while (u < S || w < S) {
        const takeUp = w >= S || (u < S && Math.floor(ups[u] / SH) <= Math.floor(downs[w] / SH));
        const key = takeUp ? ups[u++] : downs[w++];
        const state = Math.floor(key / SH);
        lvl += takeUp ? this.sSize[segOf(key)] : -this.sSize[segOf(key)];
        this.resState[r] = state; this.resLevel[r] = lvl; r++;
      }
      // Reserved bytes per pool, as changes over the states, where more than one pool has
      // segments: [{ pool, state, level }].
      const byPool = new Map();
      for (let s = 0; s < S; s++) {
        const p = this.sPool[s];
        if (!byPool.has(p)) byPool.set(p, []);
        byPool.get(p).push([this.sFirst[s], this.sSize[s]], [this.sLast[s] + 1, -this.sSize[s]]);
      }
      this.poolRes = [];
      if (byPool.size > 1) {
        for (const [pool, changes] of byPool) {
          changes.sort((x, y) => x[0] - y[0] || x[1] - y[1]); // frees first: no level overshoots
          const state = new Float64Array(changes.length), level = new Float64Array(changes.length);
          let l = 0;
          changes.forEach((c, i) => { l += c[1]; state[i] = c[0]; level[i] = l; });
          this.poolRes.push({ pool, state, level });
        }
        this.poolRes.sort((x, y) => x.pool - y.pool);
      }
      // Which stacks match the search.
      this.match = null;
      this.matchAlloc = null;
      this.modes = {};
    }

    // µs since the first timed event, at `event`.
    time(event) {
      if (!this.times) this.times = this.col('time', this.n, Float64Array, 2);
      return this.times[event];
    }

    intervalOf(event) {
      let lo = 0, hi = this.phFirst.length - 1;
      while (lo <= hi) {
        const m = (lo + hi) >> 1;
        if (this.phLast[m] < event) lo = m + 1;
        else if (this.phFirst[m] > event) hi = m - 1;
        else return m;
      }
      return -1;
    }

    // Allocations with birth <= k are [0, bornBy(k)).
    bornBy(k) {
      let lo = 0, hi = this.N;
      while (lo < hi) { const m = (lo + hi) >> 1; if (this.birth[m] <= k) lo = m + 1; else hi = m; }
      return lo;
    }

    // Colouring modes: a key per allocation (the summarised bands stack by key).
    mode(name) {
      if (this.modes[name]) return this.modes[name];
      const L = this.legend;
      let keyOf, count, colours, names;
      if (name === 'category') {
        keyOf = this.cat; count = L.categories.length; colours = L.category_colours; names = L.categories;
      } else if (name === 'phase') {
        keyOf = this.birthPhase; count = L.phases.length; colours = L.phase_colours; names = L.phases.map((p) => 'born in ' + p);
      } else {
        keyOf = new Uint8Array(this.N); count = 1; colours = ['#bab0ac']; names = ['smaller allocations'];
      }
      // Per block of CHECK states: the per-key levels at its first state, the allocation
      // pointers there, its highest total, the state of that total and the per-key levels
      // there, and its highest reserved level. A view wider than a block per pixel column
      // reads blocks, not states.
      const blocks = Math.floor((this.n + 1) / CHECK) + 1;
      const levels = new Float64Array(blocks * count);
      const argLevels = new Float64Array(blocks * count);
      const bMax = new Float64Array(blocks).fill(-1), bArg = new Int32Array(blocks), bRes = new Float64Array(blocks);
      const bBorn = new Uint32Array(blocks), bDied = new Uint32Array(blocks), bRp = new Uint32Array(blocks), bResAt = new Float64Array(blocks);
      const lv = new Float64Array(count);
      const birth = this.birth, end = this.end, order = this.deathOrder, req = this.req, N = this.N;
      let bp = 0, dp = 0, rp = 0, res = 0, total = 0;
      for (let k = 0; k <= this.n; k++) {
        while (bp < N && birth[bp] <= k) { lv[keyOf[bp]] += req[bp]; total += req[bp]; bp++; }
        while (dp < N && end[order[dp]] <= k) { const a = order[dp]; lv[keyOf[a]] -= req[a]; total -= req[a]; dp++; }
        while (rp < this.resState.length && this.resState[rp] <= k) { res = this.resLevel[rp]; rp++; }
        const j = (k / CHECK) | 0;
        if (k % CHECK === 0) { levels.set(lv, j * count); bBorn[j] = bp; bDied[j] = dp; bRp[j] = rp; bResAt[j] = res; }
        if (total > bMax[j]) { bMax[j] = total; bArg[j] = k; argLevels.set(lv, j * count); }
        if (res > bRes[j]) bRes[j] = res;
      }
      return (this.modes[name] = { name, keyOf, count, colours, names, levels, argLevels, bMax, bArg, bRes, bBorn, bDied, bRp, bResAt });
    }
    colourOf(mode, a) {
      if (mode.name === 'site') {
        const s = this.h.stack_site[this.stack[a]];
        return s >= 0 ? this.h.site_colours[s] : this.legend.palette[(this.addr[a] / 512 + this.birth[a]) % 16 | 0];
      }
      return mode.colours[mode.keyOf[a]];
    }

    // Per column of the view: the highest total, the state where it is reached, the per-key
    // levels there, and the highest reserved level.
    sweep(mode, v0, v1, W) {
      const K = mode.count;
      const colMax = new Float64Array(W).fill(-1);
      const colArg = new Int32Array(W).fill(-1);
      const colLev = new Float64Array(W * K);
      const resMax = new Float64Array(W);
      const s0 = Math.max(0, Math.floor(v0)), s1 = Math.min(this.n, Math.ceil(v1) - 1);
      const sc = W / (v1 - v0);
      const birth = this.birth, end = this.end, order = this.deathOrder, req = this.req, key = mode.keyOf, N = this.N;
      const lv = new Float64Array(K);
      let k, bp, dp, total, rp, res;
      // The state at the start of block j, with its pointers.
      const enter = (j) => {
        k = j * CHECK;
        for (let q = 0; q < K; q++) lv[q] = mode.levels[j * K + q];
        bp = mode.bBorn[j]; dp = mode.bDied[j];
        total = 0;
        for (let q = 0; q < K; q++) total += lv[q];
        rp = mode.bRp[j]; res = mode.bResAt[j];
      };
      // Moves to state k + 1.
      const step = () => {
        k++;
        while (bp < N && birth[bp] <= k) { lv[key[bp]] += req[bp]; total += req[bp]; bp++; }
        while (dp < N && end[order[dp]] <= k) { const a = order[dp]; lv[key[a]] -= req[a]; total -= req[a]; dp++; }
        while (rp < this.resState.length && this.resState[rp] <= k) { res = this.resLevel[rp]; rp++; }
      };
      enter(Math.floor(s0 / CHECK));
      while (k < s0) step();
      const colOf = (x) => { const c = Math.floor((x - v0) * sc); return c < 0 ? 0 : c >= W ? W - 1 : c; };
      while (k <= s1) {
        const j = (k / CHECK) | 0;
        const bEnd = j * CHECK + CHECK - 1;
        if (k === j * CHECK && bEnd <= s1 && colOf(k) === colOf(bEnd + 1 - 1e-9)) {
          // The whole block falls in one column.
          const c = colOf(k);
          if (mode.bMax[j] > colMax[c]) {
            colMax[c] = mode.bMax[j]; colArg[c] = mode.bArg[j];
            colLev.set(mode.argLevels.subarray(j * K, j * K + K), c * K);
          }
          if (mode.bRes[j] > resMax[c]) resMax[c] = mode.bRes[j];
          if (j + 1 < mode.bMax.length) { enter(j + 1); continue; }
          break;
        }
        let c0 = Math.floor((k - v0) * sc), c1 = Math.ceil((k + 1 - v0) * sc) - 1;
        if (c0 < 0) c0 = 0;
        if (c1 >= W) c1 = W - 1;
        if (c1 < c0) c1 = c0;
        for (let c = c0; c <= c1; c++) {
          if (total > colMax[c]) {
            colMax[c] = total; colArg[c] = k;
            for (let q = 0; q < K; q++) colLev[c * K + q] = lv[q];
          }
          if (res > resMax[c]) resMax[c] = res;
        }
        if (k === s1) break;
        step();
      }
      return { colMax, colArg, colLev, resMax, s0, s1 };
    }

    // Per key levels at one state.
    levelsAt(mode, k) {
      const K = mode.count;
      const j = Math.floor(k / CHECK);
      const lv = mode.levels.slice(j * K, j * K + K);
      let s = j * CHECK;
      let bp = mode.bBorn[j], dp = mode.bDied[j];
      while (s < k) {
        s++;
        while (bp < this.N && this.birth[bp] <= s) { lv[mode.keyOf[bp]] += this.req[bp]; bp++; }
        while (dp < this.N && this.end[this.deathOrder[dp]] <= s) { const a = this.deathOrder[dp]; lv[mode.keyOf[a]] -= this.req[a]; dp++; }
      }
      return lv;
    }

    // The K_DRAW largest allocations alive in states [s0, s1] (search matches first), in index
    // (= birth) order.
    pick(s0, s1) {
      const upto = this.bornBy(s1);
      const hist = new Uint32Array(512);
      const cls = this.sizeClass, end = this.end, m = this.matchAlloc;
      for (let i = 0; i < upto; i++) {
        if (end[i] > s0 && cls[i] > 0) hist[cls[i] + (m && m[i] ? 256 : 0)]++;
      }
      let need = K_DRAW, thr = 0;
      for (let c = 511; c > 0; c--) {
        if (hist[c] >= need) { thr = c; break; }
        need -= hist[c];
      }
      const out = [], edge = [];
      for (let i = 0; i < upto; i++) {
        if (end[i] <= s0 || cls[i] === 0) continue;
        const c = cls[i] + (m && m[i] ? 256 : 0);
        if (c > thr) out.push(i);
        else if (c === thr) edge.push(i);
      }
      if (thr > 0 && edge.length) {
        // The `need` largest of the edge class (ties: the earliest born), without a comparator
        // sort: a big trace has 10^5 allocations of one size.
        const sizes = Float64Array.from(edge, (a) => this.req[a]).sort();
        const cut = sizes[Math.max(0, sizes.length - need)];
        let above = 0;
        for (const a of edge) if (this.req[a] > cut) { out.push(a); above++; }
        let left = Math.min(need, edge.length) - above;
        for (let t = 0; t < edge.length && left > 0; t++) if (this.req[edge[t]] === cut) { out.push(edge[t]); left--; }
        return Array.from(Uint32Array.from(out).sort());
      }
      return out;
    }

    // Stacks the picked allocations over [s0, s1]: each allocation's pieces [state, offset],
    // and the drawn total (and per key) after each change.
    // Changes within one pixel column (`sc` columns per state from v0) are merged: the piece
    // keeps the highest offset of the column, as the SVG's columns do.
    stackUp(mode, picked, s0, s1, v0, sc, minMove) {
      const K = mode.count;
      const colOf = (k) => Math.floor((k - v0) * sc);
      // A piece: [first state, offset, column it waits for (-1: none), column of its start].
      const pieces = new Map();
      const stack = [], stackP = [], offs = [];
      let total = 0;
      const keyTot = new Float64Array(K);
      const events = [];
      const push = (a, k) => {
        const pc = [[k, total, -1, colOf(k)]];
        pieces.set(a, pc);
        stack.push(a); stackP.push(pc); offs.push(total);
        total += this.req[a]; keyTot[mode.keyOf[a]] += this.req[a];
      };
      for (const a of picked) {
        if (this.birth[a] <= s0) push(a, s0);
        else events.push([this.birth[a], 1, a]);
        if (this.end[a] <= s1) events.push([this.end[a], 0, a]);
      }
      events.sort((x, y) => x[0] - y[0] || x[1] - y[1] || x[2] - y[2]);
      const dState = [s0], dTotal = [total], dKeys = [keyTot.slice()];
      for (const [k, kind, a] of events) {
        const size = this.req[a];
        if (kind === 1) push(a, k);
        else {
          const p = stack.indexOf(a);
          if (p < 0) continue;
          stack.splice(p, 1); stackP.splice(p, 1); offs.splice(p, 1);
          const c = colOf(k);
          for (let q = p; q < stack.length; q++) {
            const off = (offs[q] -= size);
            // A second change in a column waits for the next column (updated by later
            // changes in the same column); moves under half a pixel are not drawn.
            const pc = stackP[q], last = pc[pc.length - 1];
            if (last[2] === c) last[1] = off;
            else if (last[1] - off < minMove) continue;
            else if (last[3] === c) pc.push([v0 + (c + 1) / sc, off, c, c + 1]);
            else pc.push([k, off, -1, c]);
          }
          total -= size; keyTot[mode.keyOf[a]] -= size;
        }
        if (dState[dState.length - 1] === k) { dTotal[dTotal.length - 1] = total; dKeys[dKeys.length - 1] = keyTot.slice(); }
        else { dState.push(k); dTotal.push(total); dKeys.push(keyTot.slice()); }
      }
      return { pieces, dState, dTotal, dKeys };
    }

    // The allocations alive at state k: [index...].
    aliveAt(k) {
      const out = [];
      const upto = this.bornBy(k);
      for (let i = 0; i < upto; i++) if (this.end[i] > k) out.push(i);
      return out;
    }

    // Segments and their blocks at state k, as layout.rs's layout_at builds them: per segment
    // its figures, and its blocks on demand (`blocks(L)`): a big trace has 10^5 segments.
    layoutAt(k) {
      const segs = [];
      for (let s = 0; s < this.S; s++) if (this.sFirst[s] <= k && k <= this.sLast[s]) segs.push(s);
      const G = segs.length;
      const starts = Float64Array.from(segs, (s) => this.sAddr[s]);
      const alive = this.aliveAt(k);
      const slot = new Int32Array(alive.length);
      const count = new Uint32Array(G + 1);
      for (let i = 0; i < alive.length; i++) {
        const a = alive[i];
        let lo = 0, hi = G;
        while (lo < hi) { const m = (lo + hi) >> 1; if (starts[m] <= this.addr[a]) lo = m + 1; else hi = m; }
        const si = lo - 1;
        slot[i] = si >= 0 && this.addr[a] < starts[si] + this.sSize[segs[si]] ? si : -1;
        if (slot[i] >= 0) count[si + 1]++;
      }
      for (let g = 1; g <= G; g++) count[g] += count[g - 1];
      const grouped = new Uint32Array(count[G]);
      const fill = count.slice(0, G);
      for (let i = 0; i < alive.length; i++) if (slot[i] >= 0) grouped[fill[slot[i]]++] = alive[i];
      const byAddr = (x, y) => this.addr[x] - this.addr[y] || x - y;
      const out = new Array(G);
      for (let g = 0; g < G; g++) {
        const s = segs[g], from = count[g], to = count[g + 1];
        if (to - from > 32) grouped.subarray(from, to).sort(byAddr);
        else {
          // Insertion sort: most segments hold a few blocks, and a sort call per segment costs more.
          for (let i = from + 1; i < to; i++) {
            const a = grouped[i];
            let j = i - 1;
            while (j >= from && byAddr(grouped[j], a) > 0) { grouped[j + 1] = grouped[j]; j--; }
            grouped[j + 1] = a;
          }
        }
        const base = this.sAddr[s], size = this.sSize[s], stop = base + size;
        const L = { seg: s, address: base, size, stream: this.sStream[s], pool: this.sPool[s], kind: this.sKind[s] & 3, expandable: (this.sKind[s] & 4) !== 0, allocated: 0, requested: 0, free: 0, holes: 0, largestHole: 0, grouped, from, to, state: k };
        let cursor = base;
        for (let i = from; i < to; i++) {
          const a = grouped[i];
          const start = Math.max(this.addr[a], cursor), end = Math.min(this.addr[a] + this.blk[a], stop);
          if (end <= start) continue;
          if (start > cursor) { L.holes++; L.free += start - cursor; if (start - cursor > L.largestHole) L.largestHole = start - cursor; }
          L.allocated += end - start; L.requested += Math.min(this.req[a], end - start);
          cursor = end;
        }
        if (stop > cursor) { L.holes++; L.free += stop - cursor; if (stop - cursor > L.largestHole) L.largestHole = stop - cursor; }
        out[g] = L;
      }
      return out;
    }

    // The blocks and holes of a segment of layoutAt, in address order; `largestHoleAt` is the
    // position of its (first) largest hole.
    blocks(L) {
      const blocks = [];
      const base = L.address, stop = base + L.size;
      let cursor = base, largest = -1, at = -1;
      const hole = (from, to) => {
        if (to > from) {
          if (to - from > largest) { largest = to - from; at = blocks.length; }
          blocks.push({ offset: from - base, size: to - from, alloc: -1 });
        }
      };
      for (let i = L.from; i < L.to; i++) {
        const a = L.grouped[i];
        const start = Math.max(this.addr[a], cursor), end = Math.min(this.addr[a] + this.blk[a], stop);
        if (end <= start) continue;
        hole(cursor, start);
        blocks.push({ offset: start - base, size: end - start, alloc: a, pending: this.pend[a] !== 0 && this.pend[a] <= L.state });
        cursor = end;
      }
      hole(cursor, stop);
      blocks.largestHoleAt = at;
      return blocks;
    }

    search(q) {
      q = q.trim().toLowerCase();
      if (!q) { this.match = null; this.matchAlloc = null; return null; }
      const fr = this.h.frames.map((f) => f[0].toLowerCase().includes(q));
      const sites = this.h.sites.map((s) => s.toLowerCase().includes(q));
      this.match = this.h.stacks.map((st, i) => st.some((f) => fr[f]) || (this.h.stack_site[i] >= 0 && sites[this.h.stack_site[i]]));
      this.matchAlloc = new Uint8Array(this.N);
      let count = 0, bytes = 0;
      const siteBytes = new Map();
      const annotated = new Set();
      for (const [i, text] of this.annotation) if (text.toLowerCase().includes(q)) annotated.add(i);
      for (let i = 0; i < this.N; i++) {
        if (this.match[this.stack[i]] || annotated.has(i)) {
          this.matchAlloc[i] = 1; count++; bytes += this.req[i];
          const s = this.h.stack_site[this.stack[i]];
          siteBytes.set(s, (siteBytes.get(s) || 0) + this.req[i]);
        }
      }
      return { count, bytes, sites: [...siteBytes.entries()].sort((a, b) => b[1] - a[1]) };
    }
    when(state) {
      // "event 12 (+0.123s), forward step 3" for the event that made state `state`.
      if (state <= 0) return 'before the first event (window start)';
      const e = state - 1;
      let s = 'event ' + fmtInt(e);
      if (this.h.timed) s += ' (+' + (this.time(e) / 1e6).toFixed(3) + 's)';
      const iv = this.intervalOf(e);
      if (iv >= 0) {
        const p = this.h.phases[iv];
        s += ', ' + this.legend.phases[p[0]] + (p[1] >= 0 ? ' step ' + p[1] : '');
      }
      return s;
    }
  }

  // ---------- a device's panel ----------
  class Panel {
    constructor(dev, root) {
      this.dev = dev;
      const h = dev.h;
      this.v0 = 0; this.v1 = dev.n + 1; this.y1 = null;
      this.modeName = h.categories_present.some((p, i) => p && i !== 6) ? 'category' : 'site';
      this.selected = -1; this.hover = -1;
      this.peakState = h.peak.event == null ? 0 : h.peak.event + 1;
      this.scrub = h.ooms.length ? h.ooms[0].event + 1 : this.peakState;
      this.sort = 'free';
      this.build(root);
    }

    build(root) {
      const d = this.dev, h = d.h;
      const oomText = h.ooms.length ? h.ooms.length + ' OOM' + (h.ooms.length > 1 ? 's' : '') + ' (first at event ' + fmtInt(h.ooms[0].event) + ')' : 'no OOM';
      this.head = el('p', { class: 'summary' },
        el('strong', { text: 'Peak ' + fmtBytes(h.peak.bytes) + ' requested' }), ' ' + (h.peak.event == null ? 'at window start' : 'at event ' + fmtInt(h.peak.event) + (h.peak.time_s != null ? ' (+' + h.peak.time_s.toFixed(3) + 's)' : '')) +
        '; reserved peak ' + fmtBytes(h.reserved_peak.bytes) + '; ' + oomText + '. ' + fmtInt(d.n) + ' events, ' + fmtInt(d.N) + ' allocations, ' + fmtInt(h.segments) + ' segments over the trace.' +
        (h.starts_mid_run ? ' The trace starts mid-run: earlier allocations start at event 0.' : ''));
      this.modeSel = el('select', { 'aria-label': 'colour by', onchange: () => { this.modeName = this.modeSel.value; this.draw(); this.drawSegments(); } },
        el('option', { value: 'category', text: 'category' }), el('option', { value: 'phase', text: 'phase of birth' }), el('option', { value: 'site', text: 'call site' }));
      this.modeSel.value = this.modeName;
      this.searchBox = el('input', { type: 'search', placeholder: 'search call site, file, function or annotation', 'aria-label': 'search', size: '36' });
      let timer = 0;
      this.searchBox.addEventListener('input', () => { clearTimeout(timer); timer = setTimeout(() => this.runSearch(), 150); });
      this.searchInfo = el('span', { class: 'muted search-info' });
      const btn = (text, title, f) => el('button', { type: 'button', title, onclick: f, text });
      this.rangeInfo = el('div', { class: 'muted range' });
      const tools = el('div', { class: 'tools' },
        el('label', {}, 'Colour by ', this.modeSel), ' ',
        this.searchBox, this.searchInfo, el('span', { class: 'spacer' }),
        btn('−', 'zoom out (−)', () => this.zoom(0.5 * (this.v0 + this.v1), 2)),
        btn('+', 'zoom in (+)', () => this.zoom(0.5 * (this.v0 + this.v1), 0.5)),
        btn('whole trace', 'show the whole trace (0 or double-click)', () => this.reset()),
        btn('peak', 'zoom to the peak (p)', () => this.focus(this.peakState)),
        h.ooms.length ? btn('OOM', 'zoom to the first OOM (o)', () => this.focus(h.ooms[0].event + 1)) : null);
      this.canvas = el('canvas', { class: 'timeline', tabindex: '0', 'aria-label': 'memory timeline' });
      this.overlay = el('canvas', { class: 'overlay' });
      this.tip = el('div', { class: 'tip', hidden: '' });
      const wrap = el('div', { class: 'canvas-wrap' }, this.canvas, this.overlay);
      document.body.append(this.tip);
      this.legendBox = el('div', { class: 'legend' });
      this.details = el('div', { class: 'details' }, el('p', { class: 'muted', text: 'Click an allocation for its size, lifetime, category and stack.' }));
      const hint = el('p', { class: 'muted hint', text: 'Wheel: zoom · drag: zoom into a range · shift+drag: zoom into a box (bytes too) · alt+drag or ←/→: pan · double-click or 0: whole trace · click: details and allocator state at that event.' });
      // Segments.
      this.slider = el('input', { type: 'range', min: '0', max: String(d.n), value: String(this.scrub), 'aria-label': 'event', class: 'scrubber' });
      this.slider.addEventListener('input', () => this.setScrub(+this.slider.value));
      this.eventBox = el('input', { type: 'number', min: '0', max: String(Math.max(0, d.n - 1)), 'aria-label': 'after event', class: 'event-box' });
      this.eventBox.addEventListener('change', () => this.setScrub(Math.max(0, Math.min(d.n, (+this.eventBox.value | 0) + 1))));
      this.sortSel = el('select', { 'aria-label': 'sort segments', onchange: () => { this.sort = this.sortSel.value; this.drawSegments(); } },
        el('option', { value: 'free', text: 'most free first' }), el('option', { value: 'size', text: 'largest first' }), el('option', { value: 'address', text: 'by address' }));
      // The segments of one kind of pool, or of one pool (shown when there is more than one).
      this.poolSel = el('select', { 'aria-label': 'pool', onchange: () => this.drawSegments() }, el('option', { value: 'all', text: 'all pools' }));
      const kindsSeen = [...new Set(h.pool_kinds || [])];
      if (kindsSeen.length > 1 || (h.pools || []).length > 2) {
        for (const kd of kindsSeen) this.poolSel.append(el('option', { value: 'kind:' + kd, text: kd.replace('_', ' ') + ' pool' + (kd === 'default' ? '' : 's') }));
        h.pools.forEach((name, i) => { if (name && name !== '(0,0)') this.poolSel.append(el('option', { value: 'pool:' + i, text: (h.pool_kinds[i] || 'pool').replace('_', ' ') + ' ' + name })); });
      }
      const poolLabel = this.poolSel.options.length > 1 ? el('label', {}, 'Pool ', this.poolSel) : null;
      const oomBtns = h.ooms.slice(0, 8).map((o, i) => btn(h.ooms.length > 1 ? 'OOM ' + (i + 1) : 'OOM', 'the allocator at OOM event ' + o.event + ' (o)', () => this.setScrub(o.event + 1)));
      const segTools = el('div', { class: 'tools seg-tools' },
        btn('◀', 'previous event ([)', () => this.setScrub(this.scrub - 1)), this.slider, btn('▶', 'next event (])', () => this.setScrub(this.scrub + 1)),
        el('label', {}, ' after event ', this.eventBox), ' ',
        btn('start', 'window start', () => this.setScrub(0)), btn('peak', 'the peak (p)', () => this.setScrub(this.peakState)), ...oomBtns, btn('end', 'the dump', () => this.setScrub(d.n)),
        el('span', { class: 'spacer' }), poolLabel, ' ', el('label', {}, 'Sort ', this.sortSel));
      this.segSummary = el('div', { class: 'seg-summary' });
      this.oomBox = el('div', { class: 'oom-box', hidden: '' });
      this.segCanvas = el('canvas', { class: 'segments', 'aria-label': 'segments' });
      this.segNote = el('p', { class: 'muted' });
      // Only the rows in sight are drawn: the canvas sits at the scroll position in a spacer
      // as tall as every row.
      this.segSpacer = el('div', { class: 'seg-spacer' }, this.segCanvas);
      const segWrap = (this.segWrap = el('div', { class: 'seg-wrap' }, this.segSpacer));
      segWrap.addEventListener('scroll', () => { if (!this.rowsPending) { this.rowsPending = true; requestAnimationFrame(() => { this.rowsPending = false; this.paintRows(); }); } });
      // What is alive: at the scrubbed event, or the leaks (alive at the dump, born in the
      // window), grouped by call site.
      this.liveMode = el('select', { 'aria-label': 'what is alive', onchange: () => this.drawLive() },
        el('option', { value: 'event', text: 'at the chosen event' }), el('option', { value: 'leaks', text: 'leaks: alive at the dump, born in the window' }));
      this.hideNeverFreed = el('input', { type: 'checkbox', 'aria-label': 'hide what never dies', onchange: () => this.drawLive() });
      this.liveTitle = el('div', { class: 'seg-summary' });
      this.liveList = el('div', { class: 'live-list', role: 'list' });
      const liveTools = el('div', { class: 'tools' }, el('label', {}, 'Alive ', this.liveMode), ' ',
        el('label', { title: 'hide the call sites none of whose allocations is ever freed (weights, optimizer state)' }, this.hideNeverFreed, ' hide what never dies'));
      root.append(this.head, tools, this.rangeInfo,
        el('div', { class: 'split' }, el('div', { class: 'left' }, wrap, this.legendBox, hint), this.details),
        el('h3', { text: 'What is alive, by call site' }), liveTools, this.liveTitle, this.liveList,
        el('h3', { text: 'Allocator state at an event: segments and their blocks' }), segTools, this.segSummary, this.oomBox, segWrap, this.segNote);
      this.bind();
      this.segCanvas.addEventListener('mousemove', (ev) => this.segHover(ev));
      this.segCanvas.addEventListener('mouseleave', () => { this.tip.hidden = true; });
      this.segCanvas.addEventListener('click', (ev) => { const hit = this.segHit(ev); if (hit && hit.alloc >= 0) { this.select(hit.alloc); } });
      new ResizeObserver(() => { this.draw(); this.drawSegments(); }).observe(wrap);
    }

    // ----- timeline geometry -----
    size() {
      const w = Math.max(400, this.canvas.parentElement.clientWidth);
      return { w, h: M.top + M.plot + M.band + M.axis + (this.dev.h.host ? M.host : 0), pw: w - M.left - M.right };
    }
    xOf(state) { const { pw } = this.size(); return M.left + (state - this.v0) / (this.v1 - this.v0) * pw; }

    draw() {
      if (!this.canvas.isConnected || this.canvas.offsetParent === null) return;
      const t0 = performance.now();
      const d = this.dev, h = d.h;
      const { w, h: H, pw } = this.size();
      const dpr = window.devicePixelRatio || 1;
      for (const c of [this.canvas, this.overlay]) {
        if (c.width !== Math.round(w * dpr) || c.height !== Math.round(H * dpr)) {
          c.width = Math.round(w * dpr); c.height = Math.round(H * dpr);
          c.style.width = w + 'px'; c.style.height = H + 'px';
        }
      }
      const g = this.canvas.getContext('2d');
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, w, H);
      const mode = d.mode(this.modeName);
      const W = Math.max(1, Math.round(pw));
      const tm = {};
      let tq = performance.now();
      const lap = (name) => { const t = performance.now(); tm[name] = +(t - tq).toFixed(1); tq = t; };
      const sw = d.sweep(mode, this.v0, this.v1, W);
      lap('sweep');
      const picked = d.pick(sw.s0, sw.s1);
      lap('pick');
      let top = 0;
      for (let c = 0; c < W; c++) top = Math.max(top, sw.colMax[c], sw.resMax[c]);
      const y1 = this.y1 != null ? this.y1 : Math.max(1, top * 1.06);
      const y0 = this.y1 != null ? this.y0 : 0;
      const st = d.stackUp(mode, picked, sw.s0, sw.s1, this.v0, W / (this.v1 - this.v0), 0.5 * (y1 - y0) / M.plot);
      lap('stack');
      this.frame = { mode, sw, picked, st, y0, y1, W, pw };
      const py = (b) => M.top + M.plot - (b - y0) / (y1 - y0) * M.plot;
      const bottom = M.top + M.plot;
      // Grid and axes.
      g.font = '11px system-ui, sans-serif';
      g.fillStyle = '#fff'; g.fillRect(M.left, M.top, pw, M.plot);
      const ys = byteStep(y1 - y0, 6);
      g.strokeStyle = '#e6e6e6'; g.lineWidth = 1; g.fillStyle = '#444'; g.textAlign = 'right'; g.textBaseline = 'middle';
      for (let v = Math.ceil(y0 / ys) * ys; v <= y1; v += ys) {
        const y = Math.round(py(v)) + 0.5;
        g.beginPath(); g.moveTo(M.left, y); g.lineTo(M.left + pw, y); g.stroke();
        g.fillText(fmtBytes(v), M.left - 6, y);
      }
      const xs = Math.max(1, niceStep(this.v1 - this.v0, Math.max(2, Math.floor(pw / 110))));
      g.textAlign = 'center'; g.textBaseline = 'top';
      for (let v = Math.ceil(this.v0 / xs) * xs; v <= this.v1; v += xs) {
        const x = Math.round(this.xOf(v)) + 0.5;
        g.beginPath(); g.moveTo(x, M.top); g.lineTo(x, bottom + 3); g.stroke();
        g.fillText(fmtInt(v), x, bottom + M.band + 4);
      }
      g.save();
      g.beginPath(); g.rect(M.left, M.top, pw, M.plot); g.clip();
      // Summarised allocations: per column, from the drawn total up to the total, by key.
      const K = mode.count;
      const findD = (k) => { let lo = 0, hi = st.dState.length; while (lo < hi) { const m = (lo + hi) >> 1; if (st.dState[m] <= k) lo = m + 1; else hi = m; } return Math.max(0, lo - 1); };
      const bandFill = mode.colours.map((c) => lighter(c, 0.55));
      for (let c = 0; c < W; c++) {
        const k = sw.colArg[c];
        if (k < 0) continue;
        const di = findD(k);
        let level = st.dTotal[di];
        for (let q = 0; q < K; q++) {
          const rest = sw.colLev[c * K + q] - st.dKeys[di][q];
          if (rest <= 0) continue;
          const ya = py(level), yb = py(level + rest);
          g.fillStyle = bandFill[q];
          g.fillRect(M.left + c, yb, 1, ya - yb);
          level += rest;
        }
      }
      lap('bands');
      // Allocations drawn one by one: one path per colour (three shades of it, so that
      // neighbours differ), pixel-aligned.
      const match = d.matchAlloc;
      const paths = new Map();
      const pathOf = (colour, shade, faded) => {
        const key = colour + shade + (faded ? 'f' : '');
        let p = paths.get(key);
        if (!p) { p = { path: new Path2D(), colour: shade ? lighter(colour, shade) : colour, faded }; paths.set(key, p); }
        return p.path;
      };
      for (const a of picked) {
        const pcs = st.pieces.get(a);
        if (!pcs) continue;
        const end = Math.min(d.end[a], sw.s1 + 1);
        const matched = !match || match[a];
        const path = pathOf(d.colourOf(mode, a), [0, 0.12, 0.24][a % 3], !matched);
        for (let i = 0; i < pcs.length; i++) {
          const ka = pcs[i][0], kb = i + 1 < pcs.length ? pcs[i + 1][0] : end;
          if (ka >= kb && i > 0) continue;
          let xa = Math.round(this.xOf(ka)), xb = Math.round(this.xOf(kb));
          if (xb - xa < 1) xb = xa + 1;
          const ya = py(pcs[i][1] + d.req[a]), yb = py(pcs[i][1]);
          // Whole pixels (neighbours share their rounded edges): thinner ones vanish into
          // their neighbours, search matches stay at least a pixel high.
          const ry = Math.round(ya);
          let rh = Math.round(yb) - ry;
          if (rh < 1 && !(match && matched)) continue;
          rh = Math.max(1, rh);
          path.rect(xa, ry, xb - xa, rh);
        }
      }
      for (const p of paths.values()) {
        g.globalAlpha = p.faded ? 0.15 : 1;
        g.fillStyle = p.colour;
        g.fill(p.path);
      }
      g.globalAlpha = 1;
      lap('pieces');
      if (this.selected >= 0 && st.pieces.has(this.selected)) this.outline(g, this.selected, py);
      // Reserved bytes.
      g.strokeStyle = '#222'; g.lineWidth = 1.2; g.setLineDash([6, 3]);
      g.beginPath();
      for (let c = 0; c < W; c++) { const y = py(sw.resMax[c]); if (c) g.lineTo(M.left + c, y); else g.moveTo(M.left, y); g.lineTo(M.left + c + 1, y); }
      g.stroke(); g.setLineDash([]);
      // Reserved bytes of each pool (more than one): the highest level in each column.
      const sc = W / (this.v1 - this.v0);
      d.poolRes.forEach((pr, i) => {
        g.strokeStyle = poolColour(i); g.lineWidth = 1.2; g.setLineDash([3, 2]);
        g.beginPath();
        let j = 0, lvl = 0;
        const first = this.v0;
        while (j < pr.state.length && pr.state[j] <= first) { lvl = pr.level[j]; j++; }
        for (let c = 0; c < W; c++) {
          const stop = this.v0 + (c + 1) / sc;
          let top = lvl;
          while (j < pr.state.length && pr.state[j] < stop) { lvl = pr.level[j]; if (lvl > top) top = lvl; j++; }
          const y = py(top);
          if (c) g.lineTo(M.left + c, y); else g.moveTo(M.left, y);
          g.lineTo(M.left + c + 1, y);
        }
        g.stroke(); g.setLineDash([]);
      });
      // Scrubber's event.
      const xs1 = this.xOf(this.scrub + 0.5);
      g.strokeStyle = '#1f6feb'; g.lineWidth = 1.5; g.beginPath(); g.moveTo(xs1, M.top); g.lineTo(xs1, bottom); g.stroke();
      g.restore();
      // OOMs.
      g.textAlign = 'center'; g.textBaseline = 'bottom'; g.font = 'bold 11px system-ui, sans-serif';
      let lastLabel = -1e9;
      for (const o of h.ooms) {
        const x = this.xOf(o.event + 1);
        if (x < M.left - 1 || x > M.left + pw + 1) continue;
        g.strokeStyle = '#d62728'; g.lineWidth = 2; g.beginPath(); g.moveTo(x, M.top); g.lineTo(x, bottom); g.stroke();
        if (x - lastLabel > 36) { g.fillStyle = '#d62728'; g.fillText('OOM', Math.min(x, M.left + pw - 14), M.top - 3); lastLabel = x; }
      }
      // The peak.
      const xp = this.xOf(this.peakState + 0.5), yp = py(h.peak.bytes);
      this.peakXY = [xp, yp];
      if (xp >= M.left - 1 && xp <= M.left + pw + 1 && yp >= M.top - 1) {
        g.strokeStyle = '#222'; g.lineWidth = 0.8; g.setLineDash([2, 3]);
        g.beginPath(); g.moveTo(M.left, yp); g.lineTo(M.left + pw, yp); g.stroke(); g.setLineDash([]);
        g.fillStyle = '#fff'; g.strokeStyle = '#222'; g.lineWidth = 2;
        g.beginPath(); g.arc(xp, yp, 4.5, 0, 2 * Math.PI); g.fill(); g.stroke();
        const label = 'peak ' + fmtBytes(h.peak.bytes) + (h.peak.event == null ? ' at window start' : ' at event ' + fmtInt(h.peak.event));
        g.font = 'bold 12px system-ui, sans-serif'; g.textBaseline = 'bottom';
        const lw = g.measureText(label).width;
        const right = xp + 10 + lw <= M.left + pw;
        g.textAlign = right ? 'left' : 'right';
        const ly = yp - 8 < M.top + 12 ? yp + 20 : yp - 8;
        g.lineWidth = 3; g.strokeStyle = '#fff'; g.strokeText(label, right ? xp + 10 : xp - 10, ly);
        g.fillStyle = '#111'; g.fillText(label, right ? xp + 10 : xp - 10, ly);
      }
      g.strokeStyle = '#999'; g.lineWidth = 1; g.strokeRect(M.left + 0.5, M.top + 0.5, pw, M.plot);
      // Phase band.
      this.drawPhases(g, pw, bottom + 2);
      g.fillStyle = '#444'; g.font = '11px system-ui, sans-serif'; g.textAlign = 'right'; g.textBaseline = 'middle';
      g.fillText('phase', M.left - 6, bottom + 2 + M.band / 2);
      g.textAlign = 'right'; g.textBaseline = 'top'; g.fillText('event', M.left - 6, bottom + M.band + 4);
      if (h.host) this.drawHost(g, pw, bottom + M.band + M.axis);
      lap('marks');
      this.legendFor(mode);
      lap('legend');
      this.timing = tm;
      const shown = picked.length;
      const inView = sw.s1 - sw.s0 + 1;
      this.rangeInfo.textContent = 'Showing events ' + fmtInt(Math.max(0, sw.s0 - 1)) + '–' + fmtInt(Math.max(0, sw.s1 - 1)) + ' of ' + fmtInt(d.n) +
        (inView < d.n + 1 ? ' (' + ((d.n + 1) / inView).toFixed(inView > (d.n + 1) / 10 ? 1 : 0) + '× zoom)' : '') + '. ' +
        'The ' + fmtInt(shown) + ' largest allocations in view are drawn one by one' + (d.matchAlloc ? ' (search matches first)' : '') + '; the others are summarised in the pale bands' + (mode.count > 1 ? ' by ' + (mode.name === 'phase' ? 'phase' : 'category') : '') + '. Dashed: reserved.';
      this.lastDrawMs = performance.now() - t0;
      this.canvas.dataset.drawMs = this.lastDrawMs.toFixed(1);
    }

    // Pinned host memory (host_traces) in its own lane under the axis, on the device's events
    // (placed by time where both traces have times) and on its own byte scale: per column the
    // highest level pinned (filled) and reserved (dashed).
    drawHost(g, pw, top) {
      const host = this.dev.h.host, W = Math.max(1, Math.round(pw));
      const lane = M.host - 26, y0 = top + 18, base = y0 + lane;
      const max = Math.max(1, host.peak_allocated, host.peak_reserved) * 1.08;
      const py = (b) => base - b / max * lane;
      g.fillStyle = '#fff'; g.fillRect(M.left, y0, pw, lane);
      const sc = W / (this.v1 - this.v0);
      const cols = (levels, start) => {
        const out = new Float64Array(W);
        let j = 0, lvl = start;
        while (j < host.state.length && host.state[j] <= this.v0) { lvl = levels[j]; j++; }
        for (let c = 0; c < W; c++) {
          const stop = this.v0 + (c + 1) / sc;
          let top = lvl;
          while (j < host.state.length && host.state[j] < stop) { lvl = levels[j]; if (lvl > top) top = lvl; j++; }
          out[c] = top;
        }
        return out;
      };
      const pinned = cols(host.allocated, host.start[0]), reserved = cols(host.reserved, host.start[1]);
      g.fillStyle = '#9ecae1';
      for (let c = 0; c < W; c++) { const y = py(pinned[c]); if (pinned[c] > 0) g.fillRect(M.left + c, y, 1, base - y); }
      g.strokeStyle = '#222'; g.lineWidth = 1; g.setLineDash([5, 3]); g.beginPath();
      for (let c = 0; c < W; c++) { const y = py(reserved[c]); if (c) g.lineTo(M.left + c, y); else g.moveTo(M.left, y); g.lineTo(M.left + c + 1, y); }
      g.stroke(); g.setLineDash([]);
      g.strokeStyle = '#999'; g.strokeRect(M.left + 0.5, y0 + 0.5, pw, lane);
      g.fillStyle = '#444'; g.font = '11px system-ui, sans-serif'; g.textAlign = 'right'; g.textBaseline = 'middle';
      g.fillText(fmtBytes(host.peak_allocated), M.left - 6, py(host.peak_allocated));
      g.fillText('0', M.left - 6, base);
      g.textAlign = 'left'; g.textBaseline = 'bottom';
      g.fillText('Pinned host memory: peak ' + fmtBytes(host.peak_allocated) + ' pinned, ' + fmtBytes(host.peak_reserved) + ' reserved (dashed)' +
        (host.by_time ? '; placed by time' : '; no times to align by: in order over the events'), M.left, y0 - 3);
    }

    // The selected allocation: darkened, with a thin edge along its top and bottom.
    warm() {
      const d = this.dev, mode = d.mode(this.modeName), W = Math.round(this.size().pw);
      for (const f of [0.5, 0.05]) {
        const w = (d.n + 1) * f, v0 = Math.max(0, this.peakState - w / 2), v1 = Math.min(d.n + 1, v0 + w);
        const sw = d.sweep(mode, v0, v1, W), picked = d.pick(sw.s0, sw.s1);
        d.stackUp(mode, picked, sw.s0, sw.s1, v0, W / (v1 - v0), 1);
      }
    }

    outline(g, a, py) {
      const d = this.dev, st = this.frame.st, pcs = st.pieces.get(a);
      const end = Math.min(d.end[a], this.frame.sw.s1 + 1);
      const shape = new Path2D(), edge = new Path2D();
      for (let i = 0; i < pcs.length; i++) {
        const ka = pcs[i][0], kb = i + 1 < pcs.length ? pcs[i + 1][0] : end;
        if (ka >= kb && i > 0) continue;
        let xa = Math.round(this.xOf(ka)), xb = Math.round(this.xOf(kb));
        if (xb - xa < 1) xb = xa + 1;
        const ya = Math.round(py(pcs[i][1] + d.req[a])), yb = Math.max(ya + 2, Math.round(py(pcs[i][1])));
        shape.rect(xa, ya, xb - xa, yb - ya);
        edge.moveTo(xa, ya + 0.5); edge.lineTo(xb, ya + 0.5);
        edge.moveTo(xa, yb - 0.5); edge.lineTo(xb, yb - 0.5);
      }
      g.fillStyle = 'rgba(0,0,0,0.45)';
      g.fill(shape);
      g.strokeStyle = '#000'; g.lineWidth = 1;
      g.stroke(edge);
    }

    drawPhases(g, pw, top) {
      const d = this.dev, ph = d.h.phases, L = d.legend;
      if (!ph.length) {
        g.fillStyle = '#666'; g.font = 'italic 11px system-ui, sans-serif'; g.textAlign = 'left'; g.textBaseline = 'middle';
        g.fillText('No phase band: ' + (d.h.phases_unknown_reason || 'no phase could be found') + '.', M.left + 4, top + M.band / 2);
        return;
      }
      const W = Math.round(pw);
      let runStart = 0, runIv = -2;
      const flush = (c1) => {
        if (runIv < 0) return;
        const p = ph[runIv];
        const x = M.left + runStart, wdt = c1 - runStart;
        g.fillStyle = L.phase_colours[p[0]];
        g.fillRect(x, top, wdt, M.band - 2);
        g.font = '10px system-ui, sans-serif';
        const name = L.phases[p[0]], short = ABBREV[name] || name, step = p[1] >= 0 ? ' ' + p[1] : '';
        const label = [name + step, short + step, short].find((t) => g.measureText(t).width + 6 < wdt);
        if (label) {
          g.fillStyle = L.phase_ink[p[0]]; g.textAlign = 'center'; g.textBaseline = 'middle';
          g.fillText(label, x + wdt / 2, top + (M.band - 2) / 2);
        }
      };
      for (let c = 0; c < W; c++) {
        const state = Math.floor(this.v0 + (c + 0.5) / pw * (this.v1 - this.v0));
        const iv = state > 0 ? d.intervalOf(state - 1) : (ph.length ? 0 : -1);
        if (iv !== runIv) { flush(c); runStart = c; runIv = iv; }
      }
      flush(W);
    }

    legendFor(mode) {
      const d = this.dev, box = this.legendBox;
      box.textContent = '';
      const item = (colour, label, pale) => el('span', { class: 'item' }, el('i', { style: 'background:' + (pale ? lighter(colour, 0.55) : colour) }), label);
      if (mode.name === 'site') {
        const bytes = new Map();
        for (const a of this.frame.picked) { const s = d.h.stack_site[d.stack[a]]; bytes.set(s, (bytes.get(s) || 0) + d.req[a]); }
        const top = [...bytes.entries()].sort((x, y) => y[1] - x[1]).slice(0, 10);
        box.append(el('span', { class: 'muted' }, 'Call sites of the drawn allocations (most bytes first): '));
        for (const [s] of top) box.append(item(s >= 0 ? d.h.site_colours[s] : '#8c8c8c', s >= 0 ? d.h.sites[s] : '<no stack>'));
        box.append(item('#bab0ac', 'smaller allocations, summarised', true));
      } else {
        const present = new Uint8Array(mode.count);
        for (let i = 0; i < d.N; i += Math.max(1, Math.floor(d.N / 50000))) present[mode.keyOf[i]] = 1;
        for (const a of this.frame.picked) present[mode.keyOf[a]] = 1;
        for (let q = 0; q < mode.count; q++) if (present[q]) box.append(item(mode.colours[q], mode.name === 'phase' ? d.legend.phases[q] : d.legend.categories[q]));
        box.append(el('span', { class: 'muted' }, ' (pale: the same, summarised)'));
      }
      box.append(el('span', { class: 'item' }, el('b', { class: 'dash' }), 'reserved'), el('span', { class: 'item' }, el('b', { class: 'ring' }), 'peak'));
      d.poolRes.forEach((pr, i) => {
        const name = d.h.pools[pr.pool], kind = (d.h.pool_kinds || [])[pr.pool] || 'default';
        box.append(el('span', { class: 'item' }, el('b', { class: 'dash', style: 'border-color:' + poolColour(i) }), 'reserved in the ' + kind.replace('_', ' ') + ' pool' + (name && name !== '(0,0)' ? ' ' + name : '')));
      });
      if (d.h.ooms.length) box.append(el('span', { class: 'item' }, el('b', { class: 'oomline' }), 'OOM'));
      box.append(el('span', { class: 'item' }, el('b', { class: 'cursor' }), 'event of the segments below'));
    }

    // ----- interaction -----
    hit(mx, my) {
      const f = this.frame;
      if (!f) return null;
      const d = this.dev;
      if (mx < M.left || mx > M.left + f.pw || my < M.top || my > M.top + M.plot) return null;
      const k = Math.floor(this.v0 + (mx - M.left) / f.pw * (this.v1 - this.v0));
      const b = (M.top + M.plot - my) / M.plot * (f.y1 - f.y0) + f.y0;
      const tol = 2 / M.plot * (f.y1 - f.y0);
      let best = -1, bestDist = Infinity;
      for (const [a, pcs] of f.st.pieces) {
        if (d.birth[a] > k && !(this.xOf(d.birth[a]) - mx < 1)) continue;
        if (d.end[a] <= k && !(mx - this.xOf(d.end[a]) < 1)) continue;
        let off = pcs[0][1];
        for (const p of pcs) { if (p[0] <= k) off = p[1]; else break; }
        const lo = off, hi = off + d.req[a];
        const dist = b < lo ? lo - b : b > hi ? b - hi : 0;
        if (dist < bestDist || (dist === bestDist && best >= 0 && d.req[a] < d.req[best])) { best = a; bestDist = dist; }
      }
      if (best >= 0 && bestDist <= tol) return { alloc: best, state: k };
      return { alloc: -1, state: Math.max(0, Math.min(d.n, k)), bytes: b };
    }

    bind() {
      const c = this.canvas, ov = this.overlay;
      let drag = null;
      const pos = (ev) => { const r = c.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; };
      const plotState = (x) => this.v0 + (x - M.left) / this.frame.pw * (this.v1 - this.v0);
      c.addEventListener('wheel', (ev) => {
        ev.preventDefault();
        const [x] = pos(ev);
        if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) { this.pan(ev.deltaX / this.frame.pw); return; }
        this.zoom(plotState(Math.max(M.left, Math.min(M.left + this.frame.pw, x))), Math.exp(Math.max(-3, Math.min(3, ev.deltaY * 0.0025))));
      }, { passive: false });
      c.addEventListener('mousedown', (ev) => {
        const [x, y] = pos(ev);
        drag = { x, y, box: ev.shiftKey, pan: ev.altKey || ev.button === 1, v0: this.v0, v1: this.v1, moved: false };
        c.focus();
        ev.preventDefault();
      });
      window.addEventListener('mousemove', (ev) => {
        if (!drag) return;
        const [x, y] = pos(ev);
        if (Math.abs(x - drag.x) + Math.abs(y - drag.y) > 4) drag.moved = true;
        if (drag.pan) {
          const ds = (x - drag.x) / this.frame.pw * (drag.v1 - drag.v0);
          this.setView(drag.v0 - ds, drag.v1 - ds, true);
          return;
        }
        const g = ov.getContext('2d');
        const dpr = window.devicePixelRatio || 1;
        g.setTransform(dpr, 0, 0, dpr, 0, 0);
        g.clearRect(0, 0, ov.width, ov.height);
        if (!drag.moved) return;
        g.fillStyle = 'rgba(31,111,235,0.15)'; g.strokeStyle = '#1f6feb';
        const xa = Math.min(x, drag.x), xb = Math.max(x, drag.x);
        const ya = drag.box ? Math.min(y, drag.y) : M.top, yb = drag.box ? Math.max(y, drag.y) : M.top + M.plot;
        g.fillRect(xa, ya, xb - xa, yb - ya); g.strokeRect(xa + 0.5, ya + 0.5, xb - xa, yb - ya);
      });
      window.addEventListener('mouseup', (ev) => {
        if (!drag) return;
        const dr = drag; drag = null;
        const g = ov.getContext('2d'); g.clearRect(0, 0, ov.width, ov.height);
        const [x, y] = pos(ev);
        if (dr.pan) return;
        if (!dr.moved) { this.click(x, y); return; }
        const sa = plotState(Math.min(x, dr.x)), sb = plotState(Math.max(x, dr.x));
        if (dr.box) {
          const f = this.frame;
          const by = (py) => (M.top + M.plot - py) / M.plot * (f.y1 - f.y0) + f.y0;
          this.y0 = Math.max(0, by(Math.max(y, dr.y))); this.y1 = by(Math.min(y, dr.y));
          if (this.y1 - this.y0 < 1) { this.y0 = null; this.y1 = null; }
        }
        this.setView(sa, sb);
      });
      c.addEventListener('dblclick', () => this.reset());
      c.addEventListener('mousemove', (ev) => {
        if (drag) return;
        const [x, y] = pos(ev);
        const hit = this.hit(x, y);
        if (!hit || hit.alloc < 0) { this.tip.hidden = true; c.style.cursor = 'crosshair'; return; }
        c.style.cursor = 'pointer';
        this.showTip(ev, hit.alloc);
      });
      c.addEventListener('mouseleave', () => { this.tip.hidden = true; });
      c.addEventListener('keydown', (ev) => this.key(ev));
    }

    key(ev) {
      const mid = 0.5 * (this.v0 + this.v1);
      const k = ev.key;
      if (k === 'ArrowLeft') this.pan(-0.2);
      else if (k === 'ArrowRight') this.pan(0.2);
      else if (k === '+' || k === '=') this.zoom(mid, 0.5);
      else if (k === '-') this.zoom(mid, 2);
      else if (k === '0') this.reset();
      else if (k === '[') this.setScrub(this.scrub - 1);
      else if (k === ']') this.setScrub(this.scrub + 1);
      else if (k === 'p') { this.focus(this.peakState); }
      else if (k === 'o' && this.dev.h.ooms.length) {
        const o = this.dev.h.ooms, next = o.find((x) => x.event + 1 > this.scrub) || o[0];
        this.focus(next.event + 1);
      } else return;
      ev.preventDefault();
    }

    showTip(ev, a) {
      const d = this.dev;
      const s = d.h.stack_site[d.stack[a]];
      this.tip.textContent = fmtBytes(d.req[a]) + ' · ' + d.legend.categories[d.cat[a]] + ' · ' + (s >= 0 ? d.h.sites[s] : '<no stack recorded>');
      this.tip.hidden = false;
      this.placeTip(ev);
    }

    placeTip(ev) {
      this.tip.style.left = Math.max(4, Math.min(ev.clientX + 14, window.innerWidth - this.tip.offsetWidth - 8)) + 'px';
      this.tip.style.top = Math.min(ev.clientY + 16, window.innerHeight - this.tip.offsetHeight - 8) + 'px';
    }

    click(x, y) {
      const hit = this.hit(x, y);
      if (!hit) return;
      if (hit.alloc >= 0) this.select(hit.alloc, hit.state);
      else this.band(hit.state, hit.bytes);
      this.setScrub(hit.state);
    }

    setView(v0, v1, quick) {
      const n1 = this.dev.n + 1;
      let w = Math.max(Math.min(v1 - v0, n1), Math.min(n1, 2));
      let a = (v0 + v1) / 2 - w / 2;
      a = Math.max(0, Math.min(n1 - w, a));
      this.v0 = a; this.v1 = a + w;
      if (this.v1 - this.v0 >= n1) { this.y0 = null; this.y1 = null; }
      this.changed();
      if (quick) { if (!this.pending) { this.pending = true; requestAnimationFrame(() => { this.pending = false; this.draw(); }); } }
      else this.draw();
    }
    zoom(center, f) { this.setView(center - (center - this.v0) * f, center + (this.v1 - center) * f); }
    pan(frac) { const s = frac * (this.v1 - this.v0); this.setView(this.v0 + s, this.v1 + s); }
    reset() { this.y0 = null; this.y1 = null; this.setView(0, this.dev.n + 1); }
    focus(state) {
      const w = Math.max(40, Math.min(this.dev.n + 1, (this.dev.n + 1) / 50));
      this.setScrub(state);
      this.setView(state + 0.5 - w / 2, state + 0.5 + w / 2);
    }

    // ----- details -----
    select(a, state) {
      this.selected = a;
      this.changed();
      const d = this.dev, h = d.h, L = d.legend;
      const box = this.details;
      box.textContent = '';
      const row = (k, v) => el('tr', {}, el('th', { text: k }), el('td', {}, v));
      const site = h.stack_site[d.stack[a]];
      const origin = ['', 'allocated before the trace window', 'allocated before the trace window, still allocated at the dump'][d.origin[a]];
      const born = d.birth[a] === 0 ? (d.origin[a] ? origin : 'at window start') : d.when(d.birth[a]);
      const died = d.end[a] > d.n ? 'alive at the end of the trace' : d.when(d.end[a]);
      const whose = codePathText(h, d.stack[a]);
      box.append(el('h4', { class: 'site', text: site >= 0 ? h.sites[site] : (d.origin[a] ? '<' + origin + '>' : '<no stack recorded>') }),
        ...(whose ? [el('p', { class: 'code-path muted', text: whose })] : []),
        el('table', {},
          row('requested', fmtExact(d.req[a])),
          row('block', fmtBytes(d.blk[a]) + (d.blk[a] !== d.req[a] ? ' (' + fmtBytes(d.blk[a] - d.req[a]) + ' rounding)' : '')),
          row('born', born), row('freed', died),
          row('alive for', d.end[a] > d.n ? fmtInt(d.n + 1 - d.birth[a]) + '+ states' : fmtInt(d.end[a] - d.birth[a]) + ' events'),
          row('category', L.categories[d.cat[a]] + ' (confidence ' + L.confidences[d.conf[a]] + ')'),
          ...(d.annotation.has(a) ? [row('annotation', d.annotation.get(a))] : []),
          row('address', hex(d.addr[a]) + ', stream ' + h.streams[d.stream[a]])));
      const st = h.stacks[d.stack[a]];
      if (!st.length) box.append(el('p', { class: 'muted', text: d.origin[a] === 1 ? 'No stack: the allocation predates the trace window.' : 'No stack recorded.' }));
      else box.append(this.stackView(st, d.origin[a] === 1 ? 'Stack (of its free: its allocation was not recorded)' : 'Stack'));
      box.append(el('p', { class: 'muted', text: 'The segments below show the allocator after this click’s event; the block is outlined there.' }));
      if (this.frame) this.draw();
      this.drawSegments();
    }

    stackView(st, title) {
      const frames = this.dev.h.frames;
      const out = el('div', { class: 'stack' }, el('h5', { text: title + ' — innermost first' }));
      const py = st.filter((f) => !frames[f][1]), cpp = st.filter((f) => frames[f][1]);
      const ol = el('ol', {});
      // Whose code each frame is: the user's (bold), a package's, the runtime's (pale).
      for (const f of py) ol.append(el('li', { class: FRAME_CLASS[frames[f][2]] || '', title: FRAME_TITLE[frames[f][2]] || '' }, ...breakable(frames[f][0])));
      out.append(ol);
      if (py.length) out.append(el('p', { class: 'muted fc-key' }, el('span', { class: 'fc-user', text: 'your code' }), ' · ', el('span', { class: 'fc-pkg', text: 'packages' }), ' · ', el('span', { class: 'fc-rt', text: 'torch and Python' })));
      if (!py.length) out.append(el('p', { class: 'muted', text: 'No Python frame.' }));
      if (cpp.length) {
        const det = el('details', {}, el('summary', { text: cpp.length + ' C++ frame' + (cpp.length > 1 ? 's' : '') + ' (folded)' }));
        const ol2 = el('ol', {});
        for (const f of cpp) ol2.append(el('li', {}, ...breakable(frames[f][0])));
        det.append(ol2);
        out.append(det);
      }
      return out;
    }

    band(state, bytes) {
      const d = this.dev, f = this.frame, mode = f.mode;
      const lv = d.levelsAt(mode, state);
      const di = (() => { const ds = f.st.dState; let lo = 0, hi = ds.length; while (lo < hi) { const m = (lo + hi) >> 1; if (ds[m] <= state) lo = m + 1; else hi = m; } return Math.max(0, lo - 1); })();
      let level = f.st.dTotal[di], q = -1;
      for (let j = 0; j < mode.count; j++) { const rest = lv[j] - f.st.dKeys[di][j]; if (rest > 0 && bytes >= level && bytes < level + rest) { q = j; break; } level += Math.max(0, rest); }
      this.selected = -1;
      const box = this.details;
      box.textContent = '';
      if (q < 0) { box.append(el('p', { class: 'muted', text: 'Nothing allocated there at ' + d.when(state) + '.' })); this.draw(); return; }
      const drawn = new Set(f.picked);
      const members = d.aliveAt(state).filter((a) => mode.keyOf[a] === q && !drawn.has(a)).sort((x, y) => d.req[y] - d.req[x]);
      const sum = members.reduce((s, a) => s + d.req[a], 0);
      box.append(el('h4', { text: mode.names[q] + ': ' + fmtBytes(sum) + ' in ' + fmtInt(members.length) + ' smaller allocations' }),
        el('p', { class: 'muted', text: 'Summarised at ' + d.when(state) + '. Zoom in to draw them one by one. The largest:' }));
      const ul = el('ul', { class: 'members' });
      for (const a of members.slice(0, 12)) {
        const s = d.h.stack_site[d.stack[a]];
        ul.append(el('li', {}, el('a', { href: '#', onclick: (ev) => { ev.preventDefault(); this.select(a, state); } }, fmtBytes(d.req[a])), ' ' + (s >= 0 ? d.h.sites[s] : '<no stack>')));
      }
      box.append(ul);
      this.draw();
    }

    // ----- segments -----
    setScrub(k) {
      k = Math.max(0, Math.min(this.dev.n, k | 0));
      this.scrub = k;
      this.slider.value = String(k);
      this.eventBox.value = k > 0 ? String(k - 1) : '';
      if (this.frame) this.draw();
      this.drawSegments();
      this.drawLive();
      this.changed();
    }

    // The panel's view changed: the page's link follows it (see main).
    changed() { if (this.onChange) this.onChange(); }

    // Per call site: whether any of its allocations is ever freed in the window (computed once).
    sitesFreed() {
      if (this.freedBySite) return this.freedBySite;
      const d = this.dev, h = d.h, freed = new Uint8Array(h.sites.length + 1);
      for (let a = 0; a < d.N; a++) if (d.end[a] <= d.n) freed[h.stack_site[d.stack[a]] + 1] = 1;
      return (this.freedBySite = freed);
    }

    // The live set (or the leaks) as a list of call sites with share bars, largest first;
    // a row opens its largest allocations, each a link to its details and stack.
    drawLive() {
      if (!this.liveList.isConnected) return;
      const t0 = performance.now();
      const d = this.dev, h = d.h, leaks = this.liveMode.value === 'leaks';
      const k = leaks ? d.n : this.scrub;
      let alive = d.aliveAt(k).filter((a) => d.req[a] > 0);
      if (leaks) alive = alive.filter((a) => d.birth[a] > 0 && d.origin[a] === 0);
      const freed = this.hideNeverFreed.checked ? this.sitesFreed() : null;
      const groups = new Map();
      let total = 0, shown = 0;
      for (const a of alive) {
        // Without a stack: keyed by why there is none (as the report names them).
        const s0 = h.stack_site[d.stack[a]], site = s0 >= 0 ? s0 : -1 - d.origin[a];
        total += d.req[a];
        if (freed && !freed[s0 + 1]) continue;
        let g = groups.get(site);
        if (!g) groups.set(site, (g = { site, bytes: 0, list: [] }));
        g.bytes += d.req[a]; g.list.push(a); shown += d.req[a];
      }
      const rows = [...groups.values()].sort((x, y) => y.bytes - x.bytes || x.site - y.site);
      const all = alive.length;
      this.liveTitle.textContent = (leaks ? 'Alive at the dump and born in the window: ' : (k === 0 ? 'At window start: ' : 'After ' + d.when(k) + ': ')) +
        fmtInt(all) + ' allocations, ' + fmtBytes(total) + ' requested' + (freed ? '; shown: ' + fmtBytes(shown) + ' from call sites that also free' : '') + '; ' + fmtInt(rows.length) + ' call sites.';
      this.liveList.textContent = '';
      const max = Math.max(1, total);
      const siteName = (site) => site >= 0 ? h.sites[site] : ['<no stack recorded>', '<allocated before the trace window>', '<allocated before the trace window, still allocated at the dump>'][-1 - site] || '<no stack recorded>';
      for (const g of rows.slice(0, 60)) {
        g.list.sort((x, y) => d.req[y] - d.req[x] || x - y);
        const row = el('details', { class: 'live-row', role: 'listitem' });
        const sum = el('summary', {},
          el('span', { class: 'live-bytes', text: fmtBytes(g.bytes) }),
          el('span', { class: 'ov-bar' }, el('i', { class: 'ov-peak', style: 'width:' + (100 * g.bytes / max).toFixed(2) + '%' })),
          el('span', { class: 'live-share muted', text: (100 * g.bytes / max).toFixed(1) + '% · ' + fmtInt(g.list.length) }),
          el('span', { class: 'cmp-key' }, siteName(g.site), ...(() => { const via = codePathText(h, d.stack[g.list[0]]); return via ? [el('span', { class: 'muted live-via', text: ' — ' + via })] : []; })()));
        row.append(sum);
        row.dataset.site = siteName(g.site); row.dataset.bytes = String(g.bytes);
        row.addEventListener('toggle', () => {
          if (!row.open || row.children.length > 1) return;
          const ul = el('ul', { class: 'members' });
          for (const a of g.list.slice(0, 20)) ul.append(el('li', {}, el('a', { href: '#', onclick: (ev) => { ev.preventDefault(); this.select(a, k); } }, fmtBytes(d.req[a])), ' ' + d.legend.categories[d.cat[a]] + ', born ' + (d.birth[a] === 0 ? 'before the window' : d.when(d.birth[a]))));
          if (g.list.length > 20) ul.append(el('li', { class: 'muted', text: '… and ' + fmtInt(g.list.length - 20) + ' more' }));
          row.append(ul);
        });
        this.liveList.append(row);
      }
      if (rows.length > 60) this.liveList.append(el('p', { class: 'muted', text: '… and ' + fmtInt(rows.length - 60) + ' smaller call sites' }));
      this.liveMs = performance.now() - t0;
    }

    drawSegments() {
      if (!this.segCanvas.isConnected || this.segCanvas.offsetParent === null) return;
      const d = this.dev, h = d.h, k = this.scrub;
      const pick = this.poolSel.value, kindsOf = h.pool_kinds || [];
      const inPool = pick === 'all' ? null : pick.startsWith('kind:') ? (s) => (kindsOf[s.pool] || 'default') === pick.slice(5) : (s) => s.pool === +pick.slice(5);
      const layout = inPool ? d.layoutAt(k).filter(inPool) : d.layoutAt(k);
      const mode = d.mode(this.modeName);
      let reserved = 0, allocated = 0, free = 0, holes = 0, requested = 0;
      let best = null;
      for (const s of layout) { reserved += s.size; allocated += s.allocated; free += s.free; holes += s.holes; requested += s.requested; if (!best || s.largestHole > best.largestHole) best = s; }
      const kinds = ['small', 'large', 'unknown'];
      this.segSummary.textContent = '';
      this.segSummary.append(el('strong', { text: k === 0 ? 'At window start' : 'After ' + d.when(k) }),
        ': ' + fmtInt(layout.length) + ' segments, ' + fmtBytes(reserved) + ' reserved, ' + fmtBytes(allocated) + ' allocated in blocks (' + fmtBytes(requested) + ' requested), ' +
        fmtBytes(free) + ' free in ' + fmtInt(holes) + ' holes' +
        (best && best.largestHole > 0 ? '; largest hole ' + fmtBytes(best.largestHole) + ' in segment ' + hex(best.address) + ' (stream ' + h.streams[best.stream] + ', ' + kinds[best.kind] + ' pool' + (h.pools[best.pool] ? ' ' + h.pools[best.pool] : '') + ')' : '') + '.');
      // At an OOM: the failed request against the largest hole it could have used.
      const oom = h.ooms.find((o) => o.event + 1 === k);
      this.oomBox.hidden = !oom;
      this.oomBox.textContent = '';
      let usable = null;
      if (oom) {
        for (const s of layout) {
          const defaultPool = !h.pools[s.pool] || h.pools[s.pool] === '(0,0)';
          if (s.stream === oom.stream && defaultPool && (kinds[s.kind] === oom.kind || s.kind === 2) && (!usable || s.largestHole > usable.largestHole)) usable = s;
        }
        const hole = usable ? usable.largestHole : 0;
        const bars = el('canvas', { class: 'oom-bars' });
        this.oomBox.append(el('p', {}, el('strong', { text: 'OOM at event ' + fmtInt(oom.event) + ': a ' + fmtBytes(oom.size) + ' request failed' }),
          ' (stream ' + h.streams[oom.stream] + ', ' + oom.kind + ' pool' + (oom.device_free != null ? '; the device had ' + fmtBytes(oom.device_free) + ' free' : '') + '). ' +
          'Largest hole it could use: ' + fmtBytes(hole) + (usable && hole ? ' in segment ' + hex(usable.address) : '') + '. ' +
          'Free in all segments: ' + fmtBytes(free) + ' in ' + fmtInt(holes) + ' holes' + (free >= oom.size && hole < oom.size ? ' — enough in total but not in one piece: fragmentation.' : free < oom.size ? ' — less than the request: the memory was full.' : '.')), bars);
        const st = h.stacks[oom.stack];
        if (st && st.length) this.oomBox.append(this.stackView(st, 'Stack of the failed request'));
        requestAnimationFrame(() => {
          const w = Math.max(300, Math.min(900, this.oomBox.clientWidth - 20)), H = 54, dpr = window.devicePixelRatio || 1;
          bars.width = w * dpr; bars.height = H * dpr; bars.style.width = w + 'px'; bars.style.height = H + 'px';
          const g = bars.getContext('2d'); g.setTransform(dpr, 0, 0, dpr, 0, 0);
          const max = Math.max(oom.size, hole, 1), bw = w - 170;
          g.font = '12px system-ui, sans-serif'; g.textBaseline = 'middle';
          g.fillStyle = '#d62728'; g.fillRect(160, 6, Math.max(2, oom.size / max * bw), 18);
          g.fillStyle = '#222'; g.fillText('request ' + fmtBytes(oom.size), 0, 15);
          g.fillStyle = '#9ecae1'; g.fillRect(160, 30, Math.max(2, hole / max * bw), 18);
          g.fillStyle = '#222'; g.fillText('largest hole ' + fmtBytes(hole), 0, 39);
        });
      }
      // Rows.
      const MAXROWS = 10000;
      let order = layout;
      if (this.sort !== 'address') {
        const keyOf = this.sort === 'free' ? (s) => s.largestHole : (s) => s.size;
        // Only the rows shown are sorted: those at or above the MAXROWS-th key.
        let cut = -Infinity;
        if (layout.length > MAXROWS) {
          const keys = Float64Array.from(layout, keyOf).sort();
          cut = keys[keys.length - MAXROWS];
        }
        order = layout.filter((s) => keyOf(s) >= cut);
        if (this.sort === 'free') order.sort((a, b) => b.largestHole - a.largestHole || b.free - a.free || a.address - b.address);
        else order.sort((a, b) => b.size - a.size || a.address - b.address);
      }
      this.segNote.textContent = layout.length > MAXROWS ? 'The first ' + fmtInt(MAXROWS) + ' of ' + fmtInt(layout.length) + ' segments are drawn (sorted ' + this.sortSel.selectedOptions[0].text + ').' : '';
      order = order.slice(0, MAXROWS);
      this.segRows = order;
      const match = d.matchAlloc;
      let highlighted = 0;
      if (match) for (const L of order) for (let i = L.from; i < L.to; i++) highlighted += match[L.grouped[i]];
      this.segBest = best; this.segUsable = usable;
      const rowH = 18;
      this.segSpacer.style.height = (Math.max(1, order.length) * rowH + 4) + 'px';
      this.paintRows();
      this.segLayout = { layout, best, usable, free, holes, reserved, allocated, highlighted };
    }

    // Draws the rows of segments in sight.
    paintRows() {
      const d = this.dev, h = d.h, order = this.segRows || [], mode = d.mode(this.modeName);
      const best = this.segBest, usable = this.segUsable, kinds = ['small', 'large', 'unknown'];
      const w = Math.max(400, this.segWrap.clientWidth - 2), rowH = 18, labelW = 250;
      const first = Math.floor(this.segWrap.scrollTop / rowH);
      const rows = Math.min(order.length - first, Math.ceil(this.segWrap.clientHeight / rowH) + 2);
      const Hc = Math.max(1, rows) * rowH + 4, dpr = window.devicePixelRatio || 1;
      this.segCanvas.width = Math.round(w * dpr); this.segCanvas.height = Math.round(Hc * dpr);
      this.segCanvas.style.width = w + 'px'; this.segCanvas.style.height = Hc + 'px';
      this.segCanvas.style.top = first * rowH + 'px';
      const g = this.segCanvas.getContext('2d');
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, w, Hc);
      const maxSize = order.reduce((m, s) => Math.max(m, s.size), 1);
      const bw = w - labelW - 8;
      this.segGeom = { rowH, labelW, bw, maxSize, first };
      const match = d.matchAlloc;
      g.font = '11px ui-monospace, Menlo, Consolas, monospace'; g.textBaseline = 'middle';
      if (!order.length) { g.fillStyle = '#666'; g.fillText('No segment at this event.', 4, 10); }
      for (let r = first; r < first + rows; r++) {
        const s = order[r], y = 2 + (r - first) * rowH;
        g.fillStyle = '#333'; g.textAlign = 'left';
        g.fillText(hex(s.address) + ' ' + fmtBytes(s.size).padStart(8) + ' ' + kinds[s.kind] + (h.pools[s.pool] && h.pools[s.pool] !== '(0,0)' ? ' pool' + h.pools[s.pool] : '') + (s.stream ? ' s' + s.stream : '') + (s.expandable ? ' exp' : ''), 2, y + rowH / 2);
        const sx = labelW, len = Math.max(2, s.size / maxSize * bw), sc = len / s.size;
        g.fillStyle = '#f3f3f3'; g.fillRect(sx, y + 2, len, rowH - 5);
        const blocks = d.blocks(s);
        blocks.forEach((b, bi) => {
          const x = sx + b.offset * sc, wd = Math.max(b.alloc >= 0 ? 0.6 : 0.3, b.size * sc);
          if (b.alloc < 0) {
            g.fillStyle = bi === blocks.largestHoleAt && s === best ? '#fde0dd' : '#fbfbfb';
            g.fillRect(x, y + 2, wd, rowH - 5);
            if (bi === blocks.largestHoleAt) { g.strokeStyle = s === best || s === usable ? '#d62728' : '#bbb'; g.lineWidth = 1; g.strokeRect(x + 0.5, y + 2.5, Math.max(0, wd - 1), rowH - 6); }
            return;
          }
          const a = b.alloc;
          g.globalAlpha = match && !match[a] ? 0.2 : b.pending ? 0.5 : 1;
          g.fillStyle = d.colourOf(mode, a);
          g.fillRect(x, y + 2, wd, rowH - 5);
          g.globalAlpha = 1;
          if ((match && match[a]) || a === this.selected) { g.strokeStyle = a === this.selected ? '#000' : '#111'; g.lineWidth = a === this.selected ? 2 : 1; g.strokeRect(x + 0.5, y + 2.5, Math.max(0, wd - 1), rowH - 6); }
        });
        g.strokeStyle = '#999'; g.lineWidth = 0.5; g.strokeRect(sx + 0.5, y + 2.5, len - 1, rowH - 6);
      }
    }

    segHit(ev) {
      const r = this.segCanvas.getBoundingClientRect();
      const x = ev.clientX - r.left, y = ev.clientY - r.top;
      const g = this.segGeom;
      if (!g) return null;
      const row = g.first + Math.floor((y - 2) / g.rowH);
      const s = this.segRows && this.segRows[row];
      if (!s || x < g.labelW) return s ? { seg: s, alloc: -1 } : null;
      const off = (x - g.labelW) / (Math.max(2, s.size / g.maxSize * g.bw) / s.size);
      const b = this.dev.blocks(s).find((b) => off >= b.offset && off < b.offset + b.size);
      return { seg: s, alloc: b ? b.alloc : -1, block: b };
    }

    segHover(ev) {
      const hit = this.segHit(ev);
      if (!hit) { this.tip.hidden = true; return; }
      const d = this.dev, s = hit.seg;
      let text;
      if (hit.alloc >= 0) {
        const a = hit.alloc, site = d.h.stack_site[d.stack[a]];
        text = fmtBytes(d.req[a]) + ' (block ' + fmtBytes(d.blk[a]) + ') · ' + d.legend.categories[d.cat[a]] + ' · ' + (site >= 0 ? d.h.sites[site] : '<no stack>') + (hit.block.pending ? ' · free pending' : '');
      } else if (hit.block) text = 'hole of ' + fmtBytes(hit.block.size) + ' in segment ' + hex(s.address);
      else text = 'segment ' + hex(s.address) + ': ' + fmtBytes(s.size) + ', ' + fmtBytes(s.allocated) + ' allocated, ' + fmtBytes(s.free) + ' free in ' + s.holes + ' holes (largest ' + fmtBytes(s.largestHole) + ')';
      this.tip.textContent = text;
      this.tip.hidden = false;
      this.placeTip(ev);
    }

    runSearch() {
      const r = this.dev.search(this.searchBox.value);
      if (!r) this.searchInfo.textContent = '';
      else if (!r.count) this.searchInfo.textContent = 'no allocation matches';
      else {
        this.searchInfo.textContent = fmtInt(r.count) + ' allocations match (' + fmtInt(r.sites.length) + ' call site' + (r.sites.length > 1 ? 's' : '') + '), highlighted';
        this.searchInfo.title = r.sites.slice(0, 10).map(([s, b]) => fmtBytes(b) + '  ' + (s >= 0 ? this.dev.h.sites[s] : '<no stack>')).join('\n');
      }
      this.searchResult = r;
      this.draw();
      this.drawSegments();
    }

    // ----- for tests and scripts -----
    api() {
      const self = this, d = this.dev;
      return {
        device: d.h.device, file: d.h.file, events: d.n, _panel: self,
        view: () => ({ v0: self.v0, v1: self.v1, y0: self.y0, y1: self.y1, drawMs: self.lastDrawMs, timing: self.timing, range: self.rangeInfo.textContent }),
        setView: (a, b) => self.setView(a, b),
        canvasRect: () => { const r = self.canvas.getBoundingClientRect(); return { x: r.left, y: r.top, w: r.width, h: r.height, left: M.left, top: M.top, plot: M.plot, pw: self.frame.pw }; },
        peak: () => { const r = self.canvas.getBoundingClientRect(); return { state: self.peakState, event: d.h.peak.event, bytes: d.h.peak.bytes, x: r.left + self.peakXY[0], y: r.top + self.peakXY[1], plotX: self.peakXY[0] }; },
        // Where the largest allocation alive at `state` is drawn (client coordinates), if drawn.
        locateLargestAt: (state) => {
          const alive = d.aliveAt(state).filter((a) => d.req[a] > 0);
          if (!alive.length) return null;
          alive.sort((x, y) => d.req[y] - d.req[x] || x - y);
          const a = alive[0], pcs = self.frame.st.pieces.get(a);
          if (!pcs) return { alloc: a, drawn: false };
          let off = pcs[0][1];
          for (const p of pcs) if (p[0] <= state) off = p[1];
          const f = self.frame, r = self.canvas.getBoundingClientRect();
          const py = (b) => M.top + M.plot - (b - f.y0) / (f.y1 - f.y0) * M.plot;
          const s = d.h.stack_site[d.stack[a]];
          return { alloc: a, drawn: true, bytes: d.req[a], site: s >= 0 ? d.h.sites[s] : null, x: r.left + self.xOf(state + 0.5), y: r.top + (py(off) + py(off + d.req[a])) / 2, height: py(off) - py(off + d.req[a]) };
        },
        details: () => self.details.innerText,
        live: () => ({ title: self.liveTitle.textContent, ms: self.liveMs, rows: [...self.liveList.querySelectorAll('.live-row')].map((r) => ({ site: r.dataset.site, bytes: +r.dataset.bytes })) }),
        setLive: (mode, hide) => { self.liveMode.value = mode; self.hideNeverFreed.checked = !!hide; self.drawLive(); },
        scrub: () => self.scrub,
        setPool: (v) => { self.poolSel.value = v; self.drawSegments(); return self.poolSel.value; },
        pools: () => [...self.poolSel.options].map((o) => o.value),
        poolLines: () => d.poolRes.map((pr) => ({ pool: d.h.pools[pr.pool], kind: (d.h.pool_kinds || [])[pr.pool], peak: Math.max(0, ...pr.level), end: (() => { let l = 0; for (let j = 0; j < pr.state.length && pr.state[j] <= d.n; j++) l = pr.level[j]; return l; })() })),
        segments: () => ({ summary: self.segSummary.innerText, oom: self.oomBox.hidden ? null : self.oomBox.innerText, largestHole: self.segLayout && self.segLayout.best ? self.segLayout.best.largestHole : 0, usableHole: self.segLayout && self.segLayout.usable ? self.segLayout.usable.largestHole : null, free: self.segLayout ? self.segLayout.free : 0, holes: self.segLayout ? self.segLayout.holes : 0, count: self.segLayout ? self.segLayout.layout.length : 0, highlighted: self.segLayout ? self.segLayout.highlighted : 0 }),
        search: () => self.searchResult ? { count: self.searchResult.count, drawnMatches: self.frame.picked.filter((a) => d.matchAlloc && d.matchAlloc[a]).length } : null,
      };
    }
  }

  // ---------- the job overview ----------
  // A bar per rank (or device): peak requested, reserved at that peak behind it, the OOM and
  // the outlier marked, largest first. A click (or Enter) opens the rank's panel. Only the
  // first rows, the outliers and the OOMs are built until "show all" is asked for.
  const OVERVIEW_ROWS = 100;
  function overview(o, open) {
    const rows = o.rows.slice().sort((a, b) => b.peak - a.peak || a.label.localeCompare(b.label, 'en', { numeric: true }));
    const max = Math.max(1, ...rows.map((r) => Math.max(r.peak, r.reserved_at_peak)));
    const kind = o.kind === 'devices' ? 'devices' : 'ranks';
    const outliers = rows.filter((r) => r.outlier);
    const box = el('section', { class: 'overview', id: 'overview', 'aria-label': 'Overview' });
    box.append(el('h3', { text: rows.length + ' ' + kind + ': median peak ' + fmtBytes(o.median_peak) + (outliers.length ? ', ' + outliers.length + ' outlier' + (outliers.length > 1 ? 's' : '') : ', no outlier') }));
    for (const r of outliers) if (r.reason) box.append(el('p', { class: 'ov-reason', text: '⚠ ' + r.reason }));
    box.append(el('p', { class: 'muted ov-note', text: 'Bars: peak requested (dark) and reserved at that peak (light), largest first. ' + (o.one_job ? 'Outliers: ' + o.rule + '.' : 'Outliers are flagged only for the ranks of one job (a rank number in every file name, or --ranks).') + ' Click a row to open it.' }));
    const list = el('div', { class: 'ov-list', role: 'list' });
    const make = (r) => {
      const w = (v) => (100 * v / max).toFixed(2) + '%';
      const bar = el('span', { class: 'ov-bar' }, el('i', { class: 'ov-res', style: 'width:' + w(r.reserved_at_peak) }), el('i', { class: 'ov-peak', style: 'width:' + w(r.peak) }));
      const value = r.error ? 'unreadable' : fmtBytes(r.peak) + ' · reserved ' + fmtBytes(r.reserved_at_peak);
      const row = el('button', { type: 'button', role: 'listitem', class: 'ov-row' + (r.outlier ? ' outlier' : '') + (r.oom ? ' oom' : ''), title: r.path + (r.reason ? '\n' + r.reason : '') },
        el('span', { class: 'ov-label', text: r.label }), bar,
        el('span', { class: 'ov-value', text: value + (r.oom ? ' · OOM' : '') + (r.outlier ? ' · outlier' : '') }));
      row.dataset.label = r.label; row.dataset.peak = String(r.peak); row.dataset.panel = String(r.panel);
      if (r.reason) row.dataset.reason = r.reason;
      if (r.panel >= 0) row.addEventListener('click', () => open(r.panel));
      else row.disabled = true;
      return row;
    };
    const first = rows.filter((r, i) => i < OVERVIEW_ROWS || r.outlier || r.oom);
    for (const r of first) list.append(make(r));
    box.append(list);
    if (first.length < rows.length) {
      const more = el('button', { type: 'button', class: 'ov-more', text: 'Show all ' + rows.length + ' ' + kind });
      more.addEventListener('click', () => { list.textContent = ''; for (const r of rows) list.append(make(r)); more.remove(); });
      box.append(more);
    }
    return box;
  }

  // ---------- the compare page ----------
  // Both runs' requested (solid) and reserved (dashed) bytes over one time axis and one byte
  // axis, each run's peak ringed at its exact figure: by training step when both runs have
  // steps (step k of both begins at the same x, events spread evenly within a step), else by
  // event. Then the allocator's state at both peaks side by side, and the call sites and
  // categories that changed at the peak, a click on a site finding it in both panels.
  const RUN_COLOURS = ['#5a5a5f', '#d95f02'];
  // x of an event on the step axis: step k spans [k, k+1); what comes before the first step
  // (the window start at event -1 included) spans [-pre, 0) and what comes after the last one
  // [n, n + post).
  function stepX(knots, events, pre, post) {
    const n = knots.length - 1;
    return (e) => {
      if (e < knots[0]) return -pre + pre * (e + 1) / (knots[0] + 1);
      if (e >= knots[n]) return n + (events > knots[n] ? post * (e - knots[n]) / (events - knots[n]) : 0);
      let lo = 0, hi = n;
      while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (knots[mid] <= e) lo = mid; else hi = mid; }
      return lo + (e - knots[lo]) / (knots[lo + 1] - knots[lo]);
    };
  }
  // How wide the parts before the first step and after the last one are, in steps: as long as
  // their events would make them beside an average step (at most one step), the same for both
  // runs so that their steps stay lined up.
  function stepMargins(runs) {
    const part = (r, events) => {
      const n = r.steps.length - 1, perStep = Math.max(1, (r.steps[n] - r.steps[0]) / n);
      return Math.min(1, events / perStep);
    };
    return [
      Math.max(...runs.map((r) => part(r, r.steps[0] + 1))),
      Math.max(...runs.map((r) => part(r, r.events - r.steps[r.steps.length - 1]))),
    ];
  }
  // The allocator's state at each run's peak, side by side, with the change.
  function stateTable(runs) {
    const [a, b] = runs.map((r) => r.state);
    const ratio = (v) => (100 * v).toFixed(1) + ' %';
    const signed = (d, f) => d === 0 ? '=' : (d > 0 ? '+' : '−') + f(Math.abs(d));
    const points = (v) => (100 * v).toFixed(1) + ' points';
    const rows = [
      ['Requested at the peak', 'requested', fmtBytes],
      ['Allocated (blocks)', 'allocated', fmtBytes],
      ['Reserved', 'reserved', fmtBytes],
      ['Reserved, not allocated', 'cached_free', fmtBytes],
      ['Free blocks', 'free_blocks', fmtInt],
      ['Largest free block', 'largest_free_block', fmtBytes],
      ['Fragmentation (1 − largest free / free)', 'fragmentation', ratio],
      ['Highest reserved in the window', 'peak_reserved', fmtBytes],
      ['OOMs', 'ooms', fmtInt],
    ];
    const table = el('table', { class: 'cmp-state', 'aria-label': 'Allocator state at the two peaks' });
    table.append(el('tr', {}, el('th', { text: 'At the peak' }), el('th', { text: 'base' }), el('th', { text: 'new' }), el('th', { text: 'change' })));
    const phase = (s) => s.phase + (s.step == null ? '' : ', step ' + s.step);
    table.append(el('tr', {}, el('td', { text: 'Phase' }), el('td', { text: phase(a) }), el('td', { text: phase(b) }), el('td', { text: phase(a) === phase(b) ? '=' : 'changed' })));
    for (const [label, key, f] of rows) {
      const tr = el('tr', {}, el('td', { text: label }), el('td', { class: 'num', text: f(a[key]) }), el('td', { class: 'num', text: f(b[key]) }),
        el('td', { class: 'num ' + (b[key] > a[key] ? 'grew' : b[key] < a[key] ? 'shrank' : ''), text: signed(b[key] - a[key], f === ratio ? points : f) }));
      tr.dataset.key = key;
      table.append(tr);
    }
    return el('div', { class: 'cmp-state-box' }, el('h4', { text: 'The allocator at each peak' }), table);
  }
  function compareSection(c, find) {
    const box = el('section', { class: 'compare', id: 'compare', 'aria-label': 'Compare' });
    const [a, b] = c.runs;
    const delta = c.peak_delta || 0;
    box.append(el('h3', { text: 'Peak ' + fmtBytes(a.peak) + ' → ' + fmtBytes(b.peak) + ' (' + (delta >= 0 ? '+' : '−') + fmtBytes(Math.abs(delta)) + ')' }));
    const legend = el('div', { class: 'legend cmp-legend' });
    c.runs.forEach((r, i) => legend.append(el('span', { class: 'item' }, el('i', { style: 'background:' + RUN_COLOURS[i] }), el('span', { text: (i ? 'new: ' : 'base: ') + r.file + ' (device ' + r.device + ', ' + fmtInt(r.events) + ' events' + (r.steps.length > 1 ? ', ' + (r.steps.length - 1) + ' steps' : '') + ')' }))));
    legend.append(el('span', { class: 'item muted', text: 'solid: requested · dashed: reserved · ring: peak' }));
    box.append(legend);
    const bySteps = c.runs.every((r) => r.steps.length > 1);
    let axis = bySteps ? 'steps' : 'events';
    const axisBox = el('div', { class: 'cmp-axis', role: 'radiogroup', 'aria-label': 'Time axis' });
    const axisButtons = {};
    for (const [mode, label] of [['steps', 'aligned steps'], ['events', 'events']]) {
      const btn = el('button', { type: 'button', role: 'radio', class: 'cmp-axis-btn', text: label, 'aria-checked': String(mode === axis) });
      if (mode === 'steps' && !bySteps) { btn.disabled = true; btn.title = 'both runs need training steps'; }
      btn.addEventListener('click', () => { axis = mode; for (const [m, x] of Object.entries(axisButtons)) x.setAttribute('aria-checked', String(m === axis)); draw(); });
      axisButtons[mode] = btn; axisBox.append(btn);
    }
    box.append(el('div', { class: 'tools' }, el('span', { class: 'muted', text: 'Time axis: ' }), axisBox));
    const W = 1100, H = 260, L = 78, R = 16, T = 12, B = 30;
    const dpr = window.devicePixelRatio || 1;
    const canvas = el('canvas', { class: 'cmp-chart', width: String(W * dpr), height: String(H * dpr), style: 'width:' + W + 'px;height:' + H + 'px', role: 'img', 'aria-label': 'requested and reserved bytes of both runs' });
    box.append(canvas);
    const g = canvas.getContext('2d');
    const yMax = Math.max(1, ...c.runs.flatMap((r) => r.points.map((p) => Math.max(p[1], p[2]))));
    const step = byteStep(yMax, 5);
    const y = (v) => T + (1 - v / yMax) * (H - T - B);
    function draw() {
      // Each run's event → axis unit, and the axis' extent in those units.
      const [pre, post] = axis === 'steps' ? stepMargins(c.runs) : [1, 0];
      const unit = c.runs.map((r) => axis === 'steps' ? stepX(r.steps, r.events, pre, post) : (e) => e);
      const lo = -pre;
      const hi = Math.max(1, ...c.runs.map((r, i) => unit[i](r.events)));
      const x = (u) => L + (u - lo) / (hi - lo) * (W - L - R);
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, W, H);
      g.setLineDash([]);
      g.font = '11px system-ui, sans-serif'; g.fillStyle = '#5a5a5f'; g.strokeStyle = '#e5e5ea'; g.lineWidth = 1;
      for (let v = 0; v <= yMax; v += step) { g.beginPath(); g.moveTo(L, y(v)); g.lineTo(W - R, y(v)); g.stroke(); g.textAlign = 'right'; g.fillText(fmtBytes(v), L - 6, y(v) + 4); }
      g.textAlign = 'center';
      if (axis === 'steps') {
        const every = Math.max(1, niceStep(hi, 12)), steps = Math.max(...c.runs.map((r) => r.steps.length - 1));
        for (let k = 0; k <= hi; k += every) {
          g.strokeStyle = '#e5e5ea'; g.beginPath(); g.moveTo(x(k), T); g.lineTo(x(k), H - B); g.stroke();
          if (k < steps) g.fillText(String(k), x(k + 0.5), H - B + 16);
        }
        g.fillStyle = '#8e8e93';
        if (pre >= 0.5) g.fillText('before', x(-pre / 2), H - B + 16);
        if (hi - steps >= 0.5) g.fillText('after', x((steps + hi) / 2), H - B + 16);
        g.fillStyle = '#5a5a5f';
        g.fillText('step', W - R - 20, H - 4);
      } else {
        const xs = niceStep(hi, 8);
        for (let e = 0; e <= hi; e += xs) g.fillText(fmtInt(e), x(e), H - B + 16);
        g.fillText('event', W - R - 20, H - 4);
      }
      c.runs.forEach((r, i) => {
        const u = unit[i];
        for (const [col, dash] of [[2, [5, 4]], [1, []]]) {
          g.beginPath(); g.setLineDash(dash); g.strokeStyle = RUN_COLOURS[i]; g.lineWidth = col === 1 ? 2 : 1.2;
          r.points.forEach((p, k) => { const nx = k + 1 < r.points.length ? r.points[k + 1][0] : r.events; if (k) g.lineTo(x(u(p[0])), y(p[col])); else g.moveTo(x(u(p[0])), y(p[col])); g.lineTo(x(u(nx)), y(p[col])); });
          g.stroke();
        }
        g.setLineDash([]);
        const pe = r.peak_event == null ? -1 : r.peak_event;
        // The peak's state spans [event, event + 1) on the axis: its ring sits in the middle.
        const px = x((u(pe) + u(pe + 1)) / 2);
        g.beginPath(); g.arc(px, y(r.peak), 6, 0, 2 * Math.PI); g.strokeStyle = RUN_COLOURS[i]; g.lineWidth = 2; g.stroke();
        r.ringX = px;
        r.knotX = r.steps.map((e) => x(u(e)));
      });
      window.snapscan.compareAxis = axis;
    }
    draw();
    box.append(stateTable(c.runs));
    const table = (title, rows, clickable) => {
      if (!rows.length) return;
      box.append(el('h4', { text: title }));
      const list = el('div', { class: 'cmp-list', role: 'list' });
      const most = Math.max(1, ...rows.map((r) => Math.abs(r.delta)));
      for (const r of rows) {
        const bar = el('span', { class: 'cmp-bar' }, el('i', { class: r.delta >= 0 ? 'grew' : 'shrank', style: 'width:' + (100 * Math.abs(r.delta) / most).toFixed(1) + '%' }));
        const row = el(clickable ? 'button' : 'div', { class: 'cmp-row' + (clickable ? ' click' : ''), role: 'listitem', title: r.key },
          el('span', { class: 'cmp-delta ' + (r.delta >= 0 ? 'grew' : 'shrank'), text: (r.delta >= 0 ? '+' : '−') + fmtBytes(Math.abs(r.delta)) }), bar,
          el('span', { class: 'cmp-key', text: r.key }),
          el('span', { class: 'muted cmp-was', text: r.change + ': ' + fmtBytes(r.base) + ' → ' + fmtBytes(r.new) }));
        row.dataset.key = r.key; row.dataset.delta = String(r.delta);
        if (clickable) { row.type = 'button'; row.addEventListener('click', () => find(r.key)); }
        list.append(row);
      }
      box.append(list);
    };
    table('Categories at the peak that changed', c.categories, false);
    table('Call sites at the peak that grew or shrank (click one to find its allocations in both runs)', c.sites, true);
    return box;
  }

  // ---------- the page ----------
  async function main() {
    const t0 = performance.now();
    const tIn = performance.now();
    const parts = await Promise.all([...document.querySelectorAll('script.snapscan-data')].map((s) => inflate(s.textContent)));
    const total = parts.reduce((s, p) => s + p.length, 0);
    const blob = new Uint8Array(total);
    let off = 0;
    for (const p of parts) { blob.set(p, off); off += p.length; }
    window.snapscan.inflateMs = performance.now() - tIn;
    const hlen = new DataView(blob.buffer).getUint32(0, true);
    const header = JSON.parse(new TextDecoder().decode(blob.subarray(4, 4 + hlen)));
    const body = blob.subarray(4 + hlen);
    const views = document.getElementById('views');
    document.getElementById('loading').remove();
    const panels = [];
    if (!header.devices.length) views.append(el('p', { text: 'No device has segments or trace entries: nothing to draw.' }));
    const tabs = el('div', { class: 'tabs', role: 'tablist' });
    const bodies = [];
    const many = new Set(header.devices.map((d) => d.file)).size > 1;
    header.devices.forEach((h, i) => {
      const label = (many ? h.file + ' — ' : '') + 'device ' + h.device + (h.ooms.length ? ' (OOM)' : '');
      const tab = el('button', { type: 'button', role: 'tab', class: 'tab', text: label, 'aria-selected': String(i === 0) });
      const root = el('div', { class: 'panel', role: 'tabpanel' });
      if (i) root.hidden = true;
      tab.addEventListener('click', () => show(i));
      tabs.append(tab); bodies.push(root);
    });
    // A job: an overview of every rank (or device) first, the tabs after it; with many
    // panels a list to pick one from replaces the tab strip.
    if (header.compare) return comparePage(header, body, views);
    const manyTabs = header.devices.length > MAX_TABS;
    let overviewBox = null, picker = null;
    if (header.overview) {
      overviewBox = overview(header.overview, (i) => { show(i); bodies[i].scrollIntoView({ block: 'start' }); });
      views.append(overviewBox);
    }
    if (manyTabs) {
      picker = el('select', { class: 'picker', 'aria-label': 'Open a panel' });
      picker.append(el('option', { value: '-1', text: 'Open a rank or device (' + header.devices.length + ')…' }));
      header.devices.forEach((h, i) => picker.append(el('option', { value: String(i), text: (many ? h.file + ' — ' : '') + 'device ' + h.device + (h.ooms.length ? ' (OOM)' : '') })));
      picker.addEventListener('change', () => { if (+picker.value >= 0) show(+picker.value); });
      views.append(el('div', { class: 'tools' }, el('label', { text: 'Panel: ' }), picker));
    } else if (header.devices.length > 1) views.append(tabs);
    for (const b of bodies) views.append(b);
    function show(i) {
      bodies.forEach((b, j) => { b.hidden = j !== i; tabs.children[j].setAttribute('aria-selected', String(j === i)); });
      if (picker) picker.value = String(i);
      if (!panels[i]) {
        let t = performance.now();
        const dev = new Device(header.devices[i], body, header.legend);
        window.snapscan.decodeMs = performance.now() - t;
        t = performance.now();
        panels[i] = new Panel(dev, bodies[i]);
        window.snapscan.panelMs = performance.now() - t;
      }
      active = i;
      panels[i].onChange = writeLink;
      panels[i].draw();
      // From navigation start to the timeline's first paint.
      if (window.snapscan.paintMs == null) window.snapscan.paintMs = performance.now();
      // The segments after the timeline's first paint; then, while the page is idle, one
      // zoomed-in round of the timeline's work (not drawn), so that the first zoom step does
      // not wait for the engine to compile it.
      setTimeout(() => { panels[i].drawSegments(); panels[i].drawLive(); setTimeout(() => panels[i].warm(), 0); }, 0);
      writeLink();
    }
    // The page's address holds the panel, the zoom, the chosen event and the selected
    // allocation (`#p=1&v=120-480&e=300&a=17`), so that a link opens on the same view.
    let linkTimer = 0;
    function writeLink() {
      clearTimeout(linkTimer);
      linkTimer = setTimeout(() => {
        const p = panels[active];
        if (!p) return;
        const hash = '#p=' + active + '&v=' + Math.round(p.v0) + '-' + Math.round(p.v1) + '&e=' + p.scrub + (p.selected >= 0 ? '&a=' + p.selected : '');
        if (location.hash !== hash) history.replaceState(null, '', hash);
      }, 200);
    }
    function readLink() {
      const q = new URLSearchParams(location.hash.slice(1));
      const i = +q.get('p');
      if (!q.has('p') || !(i >= 0 && i < header.devices.length)) return false;
      show(i);
      const p = panels[i], v = (q.get('v') || '').split('-').map(Number);
      if (v.length === 2 && v.every(Number.isFinite)) p.setView(v[0], v[1]);
      if (q.has('e')) p.setScrub(+q.get('e'));
      const a = +q.get('a');
      if (q.has('a') && a >= 0 && a < p.dev.N) p.select(a, p.scrub);
      bodies[i].scrollIntoView({ block: 'start' });
      return true;
    }
    let active = 0;
    if (readLink()) { /* opened on the linked view */ } else if (overviewBox && manyTabs) {
      // A big job opens on its overview alone: no panel is decoded until one is asked for.
      bodies.forEach((b, j) => { b.hidden = true; tabs.children[j].setAttribute('aria-selected', 'false'); });
      window.snapscan.paintMs = performance.now();
    } else if (header.devices.length) show(0);
    document.addEventListener('keydown', (ev) => {
      const t = ev.target;
      if (t && (t.tagName === 'INPUT' || t.tagName === 'SELECT' || t.tagName === 'TEXTAREA' || t.tagName === 'CANVAS')) return;
      if (panels[active]) panels[active].key(ev);
    });
    window.snapscan.panel = (i) => { if (i !== undefined) show(i); return panels[active] && panels[active].api(); };
    window.snapscan.overview = () => overviewBox ? [...overviewBox.querySelectorAll('.ov-row')].map((r) => ({ label: r.dataset.label, outlier: r.classList.contains('outlier'), reason: r.dataset.reason || null, peak: +r.dataset.peak, panel: +r.dataset.panel })) : null;
    window.snapscan.tabs = () => header.devices.map((h) => ({ file: h.file, device: h.device, oom: h.ooms.length > 0 }));
    window.snapscan.loadMs = performance.now() - t0;
  }
  // Two panels one above the other, each opened at its peak, below the compare section.
  function comparePage(header, body, views) {
    const panels = [];
    const find = (key) => {
      for (const p of panels) { p.searchBox.value = key; p.runSearch(); }
      window.snapscan.found = key;
    };
    views.append(compareSection(header.compare, find));
    header.devices.forEach((h, i) => {
      const root = el('div', { class: 'panel cmp-panel' });
      views.append(el('h3', { class: 'cmp-title', text: (i ? 'New: ' : 'Base: ') + h.file + ' — device ' + h.device }), root);
      panels.push(new Panel(new Device(h, body, header.legend), root));
    });
    for (const p of panels) { p.draw(); p.setScrub(p.peakState); }
    window.snapscan.paintMs = performance.now();
    setTimeout(() => panels.forEach((p) => p.drawSegments()), 0);
    let active = 0;
    panels.forEach((p, i) => p.canvas.addEventListener('focus', () => { active = i; }));
    document.addEventListener('keydown', (ev) => {
      const t = ev.target;
      if (t && (t.tagName === 'INPUT' || t.tagName === 'SELECT' || t.tagName === 'TEXTAREA' || t.tagName === 'CANVAS' || t.tagName === 'BUTTON')) return;
      if (panels[active]) panels[active].key(ev);
    });
    window.snapscan.panel = (i) => { if (i !== undefined) active = i; return panels[active] && panels[active].api(); };
    window.snapscan.compare = () => ({ axis: window.snapscan.compareAxis, runs: header.compare.runs.map((r) => ({ file: r.file, peak: r.peak, ringX: r.ringX, knots: r.steps, knotX: r.knotX, steps: r.steps.length ? r.steps.length - 1 : 0 })), state: [...document.querySelectorAll('#compare .cmp-state tr[data-key]')].map((tr) => [tr.dataset.key, ...[...tr.children].slice(1, 3).map((td) => td.textContent)]), sites: [...document.querySelectorAll('#compare .cmp-row.click')].map((r) => ({ key: r.dataset.key, delta: +r.dataset.delta })) });
    window.snapscan.tabs = () => header.devices.map((h) => ({ file: h.file, device: h.device, oom: h.ooms.length > 0 }));
  }
  window.snapscan = { fmtBytes };
  window.snapscan.ready = main().then(() => true, (e) => { console.error(e); const v = document.getElementById('views'); v.append(el('p', { class: 'error', text: 'Could not show the snapshot: ' + e })); return false; });
})();
