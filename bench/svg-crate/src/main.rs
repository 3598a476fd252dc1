//! Writes one SVG document twice, from the same element tree: the way snapscan does (`write!`
//! into one `String`) and with the `svg` crate (an `Element` per node, then `to_string()`), and
//! prints the median time and the size of each.
//!
//! cargo run --release --manifest-path bench/svg-crate/Cargo.toml -- PICTURE.svg [RUNS]

use std::fmt::Write;
use std::time::Instant;

use svg::node::element::Element;
use svg::node::{Node as _, Text};
use svg::parser::Event;

enum Node {
    Element {
        name: String,
        attributes: Vec<(String, String)>,
        children: Vec<Node>,
    },
    Text(String),
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The element tree of the document (the root `svg` element), attributes in document order.
fn parse(source: &str) -> Node {
    let mut stack: Vec<Node> = vec![Node::Element {
        name: String::new(),
        attributes: Vec::new(),
        children: Vec::new(),
    }];
    for event in svg::read(source).expect("parse") {
        match event {
            Event::Tag(name, kind, attrs) => {
                let mut attributes: Vec<(String, String)> = attrs
                    .iter()
                    .map(|(k, v)| (k.clone(), unescape(&v.to_string())))
                    .collect();
                attributes.sort();
                let node = Node::Element {
                    name: name.to_owned(),
                    attributes,
                    children: Vec::new(),
                };
                match kind {
                    svg::node::element::tag::Type::Start => stack.push(node),
                    svg::node::element::tag::Type::Empty => push(&mut stack, node),
                    svg::node::element::tag::Type::End => {
                        let done = stack.pop().expect("open element");
                        push(&mut stack, done);
                    }
                }
            }
            Event::Text(t) => {
                let t = t.trim();
                if !t.is_empty() {
                    push(&mut stack, Node::Text(unescape(t)));
                }
            }
            _ => {}
        }
    }
    match stack.pop() {
        Some(Node::Element { mut children, .. }) => children.remove(0),
        _ => unreachable!(),
    }
}

fn push(stack: &mut [Node], node: Node) {
    if let Some(Node::Element { children, .. }) = stack.last_mut() {
        children.push(node);
    }
}

/// By hand, as snapscan's renderers write.
fn by_hand(node: &Node, out: &mut String) {
    match node {
        Node::Text(t) => out.push_str(&escape(t)),
        Node::Element {
            name,
            attributes,
            children,
        } => {
            let _ = write!(out, "<{name}");
            for (k, v) in attributes {
                let _ = write!(out, " {k}=\"{}\"", escape(v));
            }
            if children.is_empty() {
                out.push_str("/>\n");
                return;
            }
            out.push('>');
            for c in children {
                by_hand(c, out);
            }
            let _ = writeln!(out, "</{name}>");
        }
    }
}

/// With the svg crate.
fn with_crate(node: &Node) -> Element {
    match node {
        Node::Text(_) => unreachable!(),
        Node::Element {
            name,
            attributes,
            children,
        } => {
            let mut e = Element::new(name.as_str());
            for (k, v) in attributes {
                e.assign(k.as_str(), v.as_str());
            }
            for c in children {
                match c {
                    Node::Text(t) => e.append(Text::new(t.as_str())),
                    other => e.append(with_crate(other)),
                }
            }
            e
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("PICTURE.svg");
    let runs: usize = args.next().map_or(21, |r| r.parse().expect("RUNS"));
    let source = std::fs::read_to_string(&path).expect("read");
    let tree = parse(&source);
    let (mut hand, mut krate) = (Vec::new(), Vec::new());
    let (mut hand_len, mut crate_len) = (0, 0);
    for _ in 0..runs {
        let t = Instant::now();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        by_hand(&tree, &mut out);
        hand.push(t.elapsed().as_secs_f64() * 1e3);
        hand_len = out.len();
        std::hint::black_box(out);

        let t = Instant::now();
        let out = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{}",
            with_crate(&tree)
        );
        krate.push(t.elapsed().as_secs_f64() * 1e3);
        crate_len = out.len();
        std::hint::black_box(out);
    }
    println!("input: {path} ({} bytes)", source.len());
    println!(
        "by hand (write! into a String): median {:.2} ms, {hand_len} bytes",
        median(hand)
    );
    println!(
        "svg crate (Element tree, to_string): median {:.2} ms, {crate_len} bytes",
        median(krate)
    );
}
