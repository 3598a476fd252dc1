//! Call sites: the first frame of a stack that is the user's code, not PyTorch's internals.

use crate::snapshot::{Frame, Interner, StackId};

/// MemoryViz / `_memory_viz.py` frame filter: frames of the capture machinery and the
/// interpreter loop are never shown.
pub fn viewer_shows(name: &str, filename: &str) -> bool {
    const OMIT_FUNCTIONS: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const OMIT_FILENAMES: [&str; 10] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
    ];
    !OMIT_FUNCTIONS.iter().any(|f| name.contains(f))
        && !OMIT_FILENAMES.iter().any(|f| filename.contains(f))
}

/// A C++ frame (from `stacks="all"`): no Python file behind it. Symbolized by source line it
/// names a `.cpp`; symbolized fast (`TORCH_SYMBOLIZE_MODE=fast`, the default in recent torch)
/// it names the shared object or the interpreter binary, and `??` where no symbol was found.
pub fn is_native(name: &str, filename: &str) -> bool {
    filename.is_empty()
        || filename == "??"
        || name == "??"
        || [".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh", ".c"]
            .iter()
            .any(|ext| filename.ends_with(ext))
        || is_binary(filename)
        || name.contains("::")
}

/// A shared object (`libtorch_cuda.so`, `libstdc++.so.6`) or the interpreter's executable
/// (`/usr/bin/python3.12`): never a Python source file.
fn is_binary(filename: &str) -> bool {
    let base = filename.rsplit(['/', '\\']).next().unwrap_or(filename);
    let interpreter = base
        .strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'));
    interpreter
        || base.ends_with(".so")
        || base.contains(".so.")
        || base.ends_with(".dylib")
        || base.ends_with(".dll")
        || base.ends_with(".exe")
}

/// PyTorch's own Python code (the library, not the user's script).
fn is_torch_internal(filename: &str) -> bool {
    let f = filename.replace('\\', "/");
    f.contains("/torch/") || f.starts_with("torch/") || f.contains("<frozen ")
}

/// Shortens a path for display: the part after `site-packages/`, else the last three parts.
pub fn short_path(filename: &str) -> String {
    let f = filename.replace('\\', "/");
    if let Some(pos) = f.rfind("site-packages/") {
        return f[pos + "site-packages/".len()..].to_owned();
    }
    let parts: Vec<&str> = f.split('/').filter(|p| !p.is_empty()).collect();
    if parts.len() <= 3 {
        f
    } else {
        parts[parts.len() - 3..].join("/")
    }
}

pub fn format_frame(interner: &Interner, frame: Frame) -> String {
    format!(
        "{}:{}:{}",
        short_path(interner.get_text(frame.filename)),
        frame.line,
        interner.get_text(frame.name)
    )
}

/// Frames of torch's own machinery that no user recognises as the place that allocated: the
/// caching allocator, tensor factories, the dispatcher and its generated wrappers, the unwinder,
/// the interpreter loop and thread start-up (all from `stacks="all"`).
fn is_machinery(name: &str, filename: &str) -> bool {
    const NAMES: [&str; 22] = [
        "CachingAllocator",
        "c10::cuda::",
        "at::detail::empty",
        "at::empty",
        "at::native::empty",
        "c10::impl::",
        "c10::Dispatcher",
        "c10::KernelFunction",
        "at::_ops::",
        "redispatch",
        "wrap_kernel_functor",
        "torch::unwind",
        "CapturedTraceback",
        "gather_with_cpp",
        "TensorIteratorBase",
        "create_out",
        "_PyEval",
        "_PyObject",
        "_PyFunction",
        "start_thread",
        "execute_native_thread_routine",
        "__clone",
    ];
    const FILES: [&str; 6] = [
        "CachingAllocator",
        "memory_snapshot.cpp",
        "Register",
        "VariableType",
        "nptl/",
        "sysdeps/",
    ];
    // CPython's own sources, not a user's folder that happens to be called Python/.
    let cpython = (filename.ends_with(".c") || filename.ends_with(".h"))
        && ["Objects/", "Python/", "Include/"]
            .iter()
            .any(|d| filename.contains(d));
    // CPython's C API as it shows in unwound native frames (`PyMethod_New`, `_PyRun_…`).
    let c_api = (name.starts_with("Py") || name.starts_with("_Py")) && is_native(name, filename);
    // `??`: the unwinder found no symbol, so the frame names nothing a user can act on.
    let unresolved = name == "??";
    cpython
        || c_api
        || unresolved
        || NAMES.iter().any(|n| name.contains(n))
        || FILES.iter().any(|f| filename.contains(f))
}

/// `torch::autograd::generated::AddmmBackward0::apply(...)` → `AddmmBackward0`.
fn autograd_node(name: &str) -> Option<&str> {
    if name.contains("AccumulateGrad") {
        return Some("AccumulateGrad");
    }
    let rest = name.split("torch::autograd::generated::").nth(1)?;
    // `AddmmBackward0::apply(...)`, or torch 2.6+'s `AddmmBackward0_apply_functional(...)`.
    let ident_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let ident = &rest[..ident_end];
    let node = ident.strip_suffix("_apply_functional").unwrap_or(ident);
    node.contains("Backward").then_some(node)
}

/// A C++ function name without its arguments and template arguments' noise.
fn short_native(name: &str) -> &str {
    name.split('(').next().unwrap_or(name).trim()
}

/// The call site of a stack: the innermost frame of user or framework code outside torch's own
/// Python and C++; else, for a C++-only stack (autograd's thread with `stacks="all"`), the
/// autograd node (`autograd: AddmmBackward0 (cuBLAS workspace)`); else the innermost torch
/// Python frame; else the innermost C++ frame that is not allocator, dispatcher, unwinder or
/// interpreter machinery. `None` for an empty stack.
pub fn call_site(interner: &Interner, stack: StackId) -> Option<String> {
    let frames = interner.get_stack(stack);
    let mut torch_python = None;
    let mut native = None;
    let mut node = None;
    let mut workspace = false;
    for &id in frames {
        let f = interner.get_frame(id);
        let name = interner.get_text(f.name);
        let filename = interner.get_text(f.filename);
        if name.contains("getNewWorkspace") || name.contains("getCurrentCUDABlasHandle") {
            workspace = true;
        }
        if node.is_none() {
            node = autograd_node(name);
        }
        if !viewer_shows(name, filename) || is_machinery(name, filename) {
            continue;
        }
        if is_native(name, filename) {
            if native.is_none() {
                native = Some(short_native(name));
            }
        } else if is_torch_internal(filename) {
            if torch_python.is_none() {
                torch_python = Some(f);
            }
        } else {
            return Some(format_frame(interner, f));
        }
    }
    if let Some(node) = node.filter(|_| torch_python.is_none()) {
        let what = if workspace { " (cuBLAS workspace)" } else { "" };
        return Some(format!("autograd: {node}{what}"));
    }
    if let Some(f) = torch_python {
        return Some(format_frame(interner, f));
    }
    native.map(str::to_owned).or_else(|| {
        // Nothing but machinery: its innermost frame still says more than nothing.
        frames
            .first()
            .map(|&id| format_frame(interner, interner.get_frame(id)))
    })
}

/// Whose code a frame is: the user's, a third-party package's (site-packages, dist-packages),
/// or the runtime's (torch, C++, CPython and its standard library).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameClass {
    User,
    Package,
    Runtime,
}

impl FrameClass {
    pub fn name(self) -> &'static str {
        match self {
            FrameClass::User => "user",
            FrameClass::Package => "package",
            FrameClass::Runtime => "runtime",
        }
    }
}

/// The package folder a file lies in (`transformers` for
/// `…/site-packages/transformers/models/llama/modeling_llama.py`).
fn package_of(filename: &str) -> Option<String> {
    let f = filename.replace('\\', "/");
    let rest = ["site-packages/", "dist-packages/"]
        .iter()
        .find_map(|m| f.rfind(m).map(|i| f[i + m.len()..].to_owned()))?;
    let first = rest.split('/').next().unwrap_or(&rest);
    Some(first.trim_end_matches(".py").to_owned())
}

pub fn frame_class(name: &str, filename: &str) -> FrameClass {
    let f = filename.replace('\\', "/");
    if is_native(name, filename) || is_torch_internal(filename) || f.starts_with('<') {
        return FrameClass::Runtime;
    }
    if package_of(filename).is_some() {
        return FrameClass::Package;
    }
    // CPython's standard library (`/usr/lib/python3.12/threading.py`).
    let stdlib = f.split('/').any(|p| {
        p.strip_prefix("python3.")
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit()))
    }) && f.contains("/lib/");
    if stdlib {
        FrameClass::Runtime
    } else {
        FrameClass::User
    }
}

/// `torch/nn/functional.py` + `linear` → `torch.nn.functional.linear`.
fn torch_function(filename: &str, name: &str) -> String {
    let f = filename.replace('\\', "/");
    let from = f.rfind("/torch/").map_or(0, |i| i + 1);
    let module = f[from..]
        .trim_end_matches(".py")
        .trim_end_matches("/__init__")
        .replace('/', ".");
    format!("{module}.{name}")
}

/// The path a call site's code took to the allocation ([`code_path`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CodePath {
    /// Whose code the call site frame is (`user`, `package`, `runtime`).
    pub class: Option<FrameClass>,
    /// The innermost frame of the user's code (`file:line:function`); `None` when the whole
    /// stack is packages and runtime (a library's loop).
    pub your_code: Option<String>,
    /// The packages the allocation went through below the user's code, outermost first, and
    /// the innermost torch function: `transformers → torch.nn.functional.linear`.
    pub via: Option<String>,
}

/// Whose code allocated, and through what: frames sorted into the user's code, packages and
/// the runtime.
pub fn code_path(interner: &Interner, stack: StackId) -> CodePath {
    let frames = interner.get_stack(stack);
    let mut out = CodePath::default();
    let mut torch_fn: Option<String> = None;
    let mut packages: Vec<String> = Vec::new();
    for &id in frames {
        let f = interner.get_frame(id);
        let (name, filename) = (interner.get_text(f.name), interner.get_text(f.filename));
        if !viewer_shows(name, filename) || is_machinery(name, filename) {
            continue;
        }
        let class = frame_class(name, filename);
        match class {
            FrameClass::Runtime => {
                if torch_fn.is_none() && is_torch_internal(filename) && !is_native(name, filename) {
                    torch_fn = Some(torch_function(filename, name));
                }
            }
            FrameClass::Package => {
                if out.class.is_none() {
                    out.class = Some(FrameClass::Package);
                }
                if let Some(p) = package_of(filename) {
                    if packages.last() != Some(&p) {
                        packages.push(p);
                    }
                }
            }
            FrameClass::User => {
                out.class.get_or_insert(FrameClass::User);
                out.your_code = Some(format_frame(interner, f));
                break;
            }
        }
    }
    if out.class.is_none() && !frames.is_empty() {
        out.class = Some(FrameClass::Runtime);
    }
    // Outermost first.
    packages.reverse();
    let mut via: Vec<String> = packages;
    via.extend(torch_fn);
    if !via.is_empty() {
        out.via = Some(via.join(" → "));
    }
    out
}

/// Renumbers the `stack_id`s of call-site tables, which hold the interner's stack ids while a
/// report is built, into a table that holds each stack once, and says whose code each site is
/// ([`code_path`] of its stack); returns the table.
pub fn stack_table<'a>(
    interner: &Interner,
    sites: impl Iterator<Item = &'a mut crate::report::CallSiteBytes>,
) -> crate::report::StackTable {
    // Each stack's place in the table and its code path, found once however many sites
    // (of the live set, what held it open, each OOM) name it.
    let mut index: rustc_hash::FxHashMap<u32, (u32, CodePath)> = Default::default();
    let mut table = Vec::new();
    for s in sites {
        if let Some(raw) = s.stack_id {
            let (id, path) = index.entry(raw).or_insert_with(|| {
                table.push(stack_lines(interner, StackId(raw)));
                ((table.len() - 1) as u32, code_path(interner, StackId(raw)))
            });
            s.code = path.class.map(|c| c.name().to_owned());
            s.your_code = path.your_code.clone();
            s.via = path.via.clone();
            s.stack_id = Some(*id);
        }
    }
    table
}

/// The whole stack as shown by the viewers (innermost first), repeated lines collapsed.
pub fn stack_lines(interner: &Interner, stack: StackId) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut repeats = 0usize;
    for &id in interner.get_stack(stack) {
        let f = interner.get_frame(id);
        let (name, filename) = (interner.get_text(f.name), interner.get_text(f.filename));
        // The allocator, dispatcher and interpreter frames of `stacks="all"` bury the code
        // that allocated under dozens of lines.
        if !viewer_shows(name, filename) || is_machinery(name, filename) {
            continue;
        }
        let line = format_frame(interner, f);
        if lines.last() == Some(&line) {
            repeats += 1;
            continue;
        }
        if repeats > 0 {
            lines.push(format!("<repeats {repeats} times>"));
            repeats = 0;
        }
        lines.push(line);
    }
    if repeats > 0 {
        lines.push(format!("<repeats {repeats} times>"));
    }
    lines
}

/// Call sites computed once per distinct stack (a live set has thousands of allocations but
/// few distinct stacks).
pub struct CallSites<'a> {
    interner: &'a Interner,
    cache: std::cell::RefCell<rustc_hash::FxHashMap<StackId, Option<std::sync::Arc<str>>>>,
}

impl<'a> CallSites<'a> {
    pub fn new(interner: &'a Interner) -> Self {
        CallSites {
            interner,
            cache: Default::default(),
        }
    }

    pub fn of(&self, stack: StackId) -> Option<std::sync::Arc<str>> {
        if let Some(hit) = self.cache.borrow().get(&stack) {
            return hit.clone();
        }
        let site: Option<std::sync::Arc<str>> = call_site(self.interner, stack).map(Into::into);
        self.cache.borrow_mut().insert(stack, site.clone());
        site
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_the_user_s_a_package_s_or_the_runtime_s() {
        use FrameClass::*;
        let c = |f: &str, n: &str| frame_class(n, f);
        assert_eq!(c("/home/me/model.py", "forward"), User);
        assert_eq!(c("C:\\work\\train.py", "main"), User);
        assert_eq!(
            c(
                "/venv/lib/python3.11/site-packages/transformers/trainer.py",
                "train"
            ),
            Package
        );
        assert_eq!(
            c(
                "/usr/lib/python3/dist-packages/einops/_backends.py",
                "einsum"
            ),
            Package
        );
        assert_eq!(
            c(
                "/venv/lib/python3.11/site-packages/torch/nn/functional.py",
                "linear"
            ),
            Runtime
        );
        assert_eq!(c("/usr/lib/python3.12/threading.py", "run"), Runtime);
        assert_eq!(c("??", "at::native::add"), Runtime);
        assert_eq!(c("<frozen runpy>", "_run_code"), Runtime);
        assert_eq!(
            torch_function("/venv/site-packages/torch/nn/functional.py", "linear"),
            "torch.nn.functional.linear"
        );
    }

    #[test]
    fn the_path_goes_from_the_user_s_code_through_packages_to_torch() {
        let mut i = Interner::default();
        let user = stack(
            &mut i,
            &[
                (
                    "/venv/site-packages/torch/nn/functional.py",
                    "scaled_dot_product_attention",
                ),
                (
                    "/venv/site-packages/transformers/models/llama/modeling_llama.py",
                    "forward",
                ),
                (
                    "/venv/site-packages/torch/nn/modules/module.py",
                    "_call_impl",
                ),
                ("/venv/site-packages/accelerate/hooks.py", "new_forward"),
                ("/home/me/model.py", "forward"),
                ("/home/me/train.py", "main"),
            ],
        );
        let p = code_path(&i, user);
        assert_eq!(p.class, Some(FrameClass::Package));
        assert_eq!(p.your_code.as_deref(), Some("/home/me/model.py:0:forward"));
        assert_eq!(
            p.via.as_deref(),
            Some("accelerate → transformers → torch.nn.functional.scaled_dot_product_attention")
        );
        // A library's loop alone: no code of the user's.
        let lib = stack(
            &mut i,
            &[(
                "/venv/site-packages/lightning/pytorch/loops/fit_loop.py",
                "run",
            )],
        );
        assert_eq!(code_path(&i, lib).your_code, None);
    }

    #[test]
    fn short_paths() {
        assert_eq!(
            short_path("/usr/lib/python3/site-packages/transformers/models/llama.py"),
            "transformers/models/llama.py"
        );
        assert_eq!(short_path("/home/u/proj/src/train.py"), "proj/src/train.py");
        assert_eq!(short_path("C:\\work\\x.py"), "C:/work/x.py");
    }

    #[test]
    fn picks_first_user_frame() {
        let mut i = Interner::default();
        let mk = |i: &mut Interner, name: &str, file: &str, line| {
            let f = Frame {
                name: i.text(name),
                filename: i.text(file),
                line,
            };
            i.frame(f)
        };
        let a = mk(&mut i, "torch::unwind::unwind()", "??", 0);
        let b = mk(
            &mut i,
            "forward",
            "/x/site-packages/torch/nn/modules/linear.py",
            125,
        );
        let c = mk(&mut i, "step", "/home/me/train.py", 42);
        let s = i.stack(vec![a, b, c]);
        assert_eq!(
            call_site(&i, s).as_deref(),
            Some("/home/me/train.py:42:step")
        );
        assert_eq!(call_site(&i, StackId::EMPTY), None);
    }

    fn stack(i: &mut Interner, frames: &[(&str, &str)]) -> StackId {
        let ids = frames
            .iter()
            .map(|(file, name)| {
                let f = Frame {
                    name: i.text(name),
                    filename: i.text(file),
                    line: 0,
                };
                i.frame(f)
            })
            .collect();
        i.stack(ids)
    }

    #[test]
    fn cpp_only_autograd_stacks_are_named_by_their_node() {
        let mut i = Interner::default();
        let s = stack(
            &mut i,
            &[
                ("??", "torch::unwind::unwind()"),
                ("CUDACachingAllocator.cpp", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
                ("", "at::cuda::getNewWorkspace()"),
                ("??", "at::cuda::getCurrentCUDABlasHandle()"),
                ("Blas.cpp", "at::native::(anonymous namespace)::addmm_out_cuda_impl(at::Tensor&)"),
                ("RegisterCUDA.cpp", "at::(anonymous namespace)::wrapper_CUDA_mm(at::Tensor const&)"),
                ("??", "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
                ("??", "torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)"),
                ("??", "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)"),
                ("??", "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
                ("./nptl/pthread_create.c", "start_thread"),
            ],
        );
        assert_eq!(
            call_site(&i, s).as_deref(),
            Some("autograd: AddmmBackward0 (cuBLAS workspace)")
        );
        let lines = stack_lines(&i, s);
        assert!(
            lines.iter().all(|l| !l.contains("CachingAllocator")),
            "{lines:?}"
        );
    }

    #[test]
    fn fast_symbolized_frames_of_shared_objects_and_the_interpreter_are_native() {
        // As torch 2.11 writes them with `stacks="all"` and TORCH_SYMBOLIZE_MODE=fast: the
        // file is the shared object or the interpreter, the line an offset, `??` where no
        // symbol was found.
        let mut i = Interner::default();
        let lib = "/venv/lib/python3.12/site-packages/torch/lib/libtorch_python.so";
        let s = stack(
            &mut i,
            &[
                (lib, "torch::autograd::THPVariable_scaled_dot_product_attention(_object*, _object*, _object*)"),
                ("/usr/bin/python3.12", "??"),
                ("/usr/bin/python3.12", "_PyObject_MakeTpCall"),
                ("/home/me/model.py", "forward"),
            ],
        );
        assert_eq!(
            call_site(&i, s).as_deref(),
            Some("/home/me/model.py:0:forward")
        );
        let lines = stack_lines(&i, s);
        assert!(lines.iter().all(|l| !l.contains("??")), "{lines:?}");
        // The autograd thread: no Python frame, the node named by torch 2.6+'s functional form.
        let s = stack(
            &mut i,
            &[
                ("/lib/x86_64-linux-gnu/libstdc++.so.6", "??"),
                (lib.trim_end_matches("python.so"), "torch::autograd::generated::MmBackward0_apply_functional(std::vector<at::Tensor, std::allocator<at::Tensor> >&&, std::array<bool, 2ul>)"),
            ],
        );
        assert_eq!(call_site(&i, s).as_deref(), Some("autograd: MmBackward0"));
        assert!(is_native("??", "/usr/bin/python3"));
        assert!(is_native("f", "C:\\Python312\\python312.dll"));
        assert!(!is_native("<module>", "/usr/local/bin/torchrun"));
        assert!(!is_native("main", "/home/me/python/train.py"));
    }

    #[test]
    fn allocator_and_interpreter_frames_are_never_the_call_site() {
        let mut i = Interner::default();
        let s = stack(
            &mut i,
            &[
                (
                    "CUDACachingAllocator.cpp",
                    "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)",
                ),
                ("??", "at::detail::empty_cuda(c10::ArrayRef<long>)"),
                (
                    "python_variable_methods.cpp",
                    "torch::autograd::THPVariable_div(_object*, _object*)",
                ),
                (
                    "/conda/python-3.12.2/Objects/descrobject.c",
                    "method_vectorcall_VARARGS_KEYWORDS",
                ),
                ("/home/me/attention/scheduler.py", "step"),
            ],
        );
        assert_eq!(
            call_site(&i, s).as_deref(),
            Some("me/attention/scheduler.py:0:step")
        );
    }
}
