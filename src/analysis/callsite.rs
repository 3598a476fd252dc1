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

/// A C++ frame (from `stacks="all"`): no Python file behind it.
fn is_native(name: &str, filename: &str) -> bool {
    filename.is_empty()
        || filename == "??"
        || [".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh", ".c"]
            .iter()
            .any(|ext| filename.ends_with(ext))
        || name.contains("::")
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

/// The call site of a stack: the innermost shown frame outside PyTorch internals and C++; else
/// the innermost shown frame; `None` for an empty stack.
pub fn call_site(interner: &Interner, stack: StackId) -> Option<String> {
    let frames = interner.get_stack(stack);
    let mut first_shown = None;
    for &id in frames {
        let f = interner.get_frame(id);
        let name = interner.get_text(f.name);
        let filename = interner.get_text(f.filename);
        if !viewer_shows(name, filename) {
            continue;
        }
        if first_shown.is_none() {
            first_shown = Some(f);
        }
        if !is_native(name, filename) && !is_torch_internal(filename) {
            return Some(format_frame(interner, f));
        }
    }
    first_shown.map(|f| format_frame(interner, f))
}

/// The whole stack as shown by the viewers (innermost first), repeated lines collapsed.
pub fn stack_lines(interner: &Interner, stack: StackId) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut repeats = 0usize;
    for &id in interner.get_stack(stack) {
        let f = interner.get_frame(id);
        if !viewer_shows(interner.get_text(f.name), interner.get_text(f.filename)) {
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
    cache: std::cell::RefCell<rustc_hash::FxHashMap<StackId, Option<std::rc::Rc<str>>>>,
}

impl<'a> CallSites<'a> {
    pub fn new(interner: &'a Interner) -> Self {
        CallSites {
            interner,
            cache: Default::default(),
        }
    }

    pub fn of(&self, stack: StackId) -> Option<std::rc::Rc<str>> {
        if let Some(hit) = self.cache.borrow().get(&stack) {
            return hit.clone();
        }
        let site: Option<std::rc::Rc<str>> = call_site(self.interner, stack).map(Into::into);
        self.cache.borrow_mut().insert(stack, site.clone());
        site
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
