//! Interned texts, frames and stacks behind small id newtypes.

use rustc_hash::FxHashMap;

/// An interned text (file name, function name, metadata string).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TextId(pub u32);

/// An interned frame (`name`, `filename`, `line`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u32);

/// An interned stack: a list of frames, innermost first. `StackId::EMPTY` is "no frames".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u32);

impl StackId {
    pub const EMPTY: StackId = StackId(0);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub name: TextId,
    pub filename: TextId,
    pub line: i64,
}

#[derive(Debug)]
pub struct Interner {
    texts: Vec<Box<str>>,
    text_index: FxHashMap<Box<str>, TextId>,
    frames: Vec<Frame>,
    frame_index: FxHashMap<Frame, FrameId>,
    stacks: Vec<Box<[FrameId]>>,
    stack_index: FxHashMap<Box<[FrameId]>, StackId>,
}

impl Default for Interner {
    fn default() -> Self {
        let mut interner = Interner {
            texts: Vec::new(),
            text_index: FxHashMap::default(),
            frames: Vec::new(),
            frame_index: FxHashMap::default(),
            stacks: Vec::new(),
            stack_index: FxHashMap::default(),
        };
        let empty = interner.stack(Vec::new());
        debug_assert_eq!(empty, StackId::EMPTY);
        interner
    }
}

/// Texts longer than this (no real frame name, file name or tag comes near) are kept shortened:
/// the report copies a text into every row that names it, so one long text shared by many
/// rows would otherwise multiply (a 1 MB file name in 300 rows: 300 MB of report).
pub const MAX_TEXT_BYTES: usize = 16 << 10;

/// `text` cut to [`MAX_TEXT_BYTES`] at a character boundary, saying how long it was.
fn shortened(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_TEXT_BYTES {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = MAX_TEXT_BYTES - 64;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}… (shortened: {} bytes in all)",
        &text[..end],
        text.len()
    ))
}

impl Interner {
    pub fn text(&mut self, text: &str) -> TextId {
        let text = &*shortened(text);
        if let Some(&id) = self.text_index.get(text) {
            return id;
        }
        let id = TextId(self.texts.len() as u32);
        self.texts.push(text.into());
        self.text_index.insert(text.into(), id);
        id
    }

    pub fn frame(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.frame_index.get(&frame) {
            return id;
        }
        let id = FrameId(self.frames.len() as u32);
        self.frames.push(frame);
        self.frame_index.insert(frame, id);
        id
    }

    /// [`stack`](Self::stack) of frames the caller keeps: copied only when new.
    pub fn stack_of(&mut self, frames: &[FrameId]) -> StackId {
        match self.stack_index.get(frames) {
            Some(&id) => id,
            None => self.add_stack(frames.into()),
        }
    }

    pub fn stack(&mut self, frames: Vec<FrameId>) -> StackId {
        match self.stack_index.get(frames.as_slice()) {
            Some(&id) => id,
            None => self.add_stack(frames.into()),
        }
    }

    /// A stack not interned yet.
    fn add_stack(&mut self, frames: Box<[FrameId]>) -> StackId {
        let id = StackId(self.stacks.len() as u32);
        self.stacks.push(frames.clone());
        self.stack_index.insert(frames, id);
        id
    }

    pub fn get_text(&self, id: TextId) -> &str {
        &self.texts[id.0 as usize]
    }

    pub fn get_frame(&self, id: FrameId) -> Frame {
        self.frames[id.0 as usize]
    }

    /// Frames of a stack, innermost first.
    pub fn get_stack(&self, id: StackId) -> &[FrameId] {
        &self.stacks[id.0 as usize]
    }

    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_are_kept_shortened_and_short_ones_whole() {
        let mut i = Interner::default();
        let short = i.text("model.py");
        assert_eq!(i.get_text(short), "model.py");
        let long = "é".repeat(MAX_TEXT_BYTES);
        let id = i.text(&long);
        let kept = i.get_text(id);
        assert!(kept.len() <= MAX_TEXT_BYTES, "{}", kept.len());
        assert!(kept.ends_with(&format!("(shortened: {} bytes in all)", long.len())));
        assert_eq!(i.text(&long), id, "the same long text is one text");
    }
}
