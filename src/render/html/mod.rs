//! `snapscan view` and `report --html`: one self-contained HTML page with the report, an
//! interactive memory timeline (canvas), allocation details, the allocator state at any event
//! and search, per device.
//!
//! Nothing is fetched: a Content-Security-Policy forbids every request, the script and the style
//! are inline (view.js, view.css, embedded at build time), and the data is embedded as gzip
//! chunks in base64 that the page inflates with the browser's `DecompressionStream`.

pub mod data;
pub mod markdown;

use std::io::Write;

use rayon::prelude::*;
use serde_json::json;

use crate::analysis::report::DeviceParts;
use crate::snapshot::{Action, Snapshot};

const SCRIPT: &str = include_str!("view.js");
const STYLE: &str = include_str!("view.css");

/// Uncompressed bytes per gzip chunk (chunks are compressed in parallel).
const CHUNK: usize = 4 << 20;

/// The page's policy: no request of any kind, inline script and style only.
pub const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'";

/// One panel of the page: a device of a snapshot, with what its report was made of.
pub struct Panel<'a> {
    pub name: &'a str,
    pub snapshot: &'a Snapshot,
    pub device: i64,
    pub parts: &'a DeviceParts,
}

/// A snapshot as the page gets it: its name, the snapshot and the parts of the devices that
/// its report analysed.
pub type PageFile<'a> = (&'a str, &'a Snapshot, &'a [DeviceParts]);

/// The panels of the snapshots (every device, or only `device`; a device the report did not
/// analyse has none), the devices with an OOM first.
pub fn panels<'a>(files: &[PageFile<'a>], device: Option<i64>) -> anyhow::Result<Vec<Panel<'a>>> {
    let mut out = Vec::new();
    for &(name, snapshot, parts) in files {
        for d in super::svg::devices(snapshot, device)? {
            let Some(parts) = parts.iter().find(|p| p.replay.device == d) else {
                continue;
            };
            out.push(Panel {
                name,
                snapshot,
                device: d,
                parts,
            });
        }
    }
    // Stable: file order, then device order, within "has an OOM" and "has none".
    out.sort_by_key(|p| !has_oom(p.snapshot, p.device));
    Ok(out)
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(T[(v >> 18) as usize & 63] as char);
        out.push(T[(v >> 12) as usize & 63] as char);
        out.push(if c.len() > 1 {
            T[(v >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if c.len() > 2 {
            T[v as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 4),
        flate2::Compression::new(6),
    );
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(bytes);
    enc.finish().unwrap_or_default()
}

/// `value` as JSON at the end of `out` (writing into a Vec cannot fail).
fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    let _ = serde_json::to_writer(out, value);
}

/// Text for inside a `<script>` element: no `</script` can end it early.
fn script_text(text: &str) -> String {
    text.replace("</", "<\\/")
}

/// One panel's part of the page, made while its snapshot is loaded (a job's page keeps these,
/// not the snapshots): its name, device, whether it has an OOM, its header and its columns.
pub struct PanelData {
    pub name: String,
    pub device: i64,
    pub oom: bool,
    /// The panel's header as JSON text (an object; the page adds where its columns lie): a
    /// job's thousand headers take a tenth of the memory as text that they take as values.
    header: Vec<u8>,
    columns: data::Columns,
}

/// The page's data of `panels`, each file's pinned host levels found once (at its first panel)
/// for all its devices.
pub fn panel_data(panels: &[Panel]) -> Vec<PanelData> {
    let mut first_panel: rustc_hash::FxHashMap<*const Snapshot, usize> = Default::default();
    let first_of_file: Vec<usize> = panels
        .iter()
        .enumerate()
        .map(|(i, p)| {
            *first_panel
                .entry(std::ptr::from_ref(p.snapshot))
                .or_insert(i)
        })
        .collect();
    let host: Vec<Option<crate::analysis::host::HostLevels>> = panels
        .par_iter()
        .enumerate()
        .map(|(i, p)| {
            (first_of_file[i] == i)
                .then(|| crate::analysis::host::host_levels(p.snapshot))
                .flatten()
        })
        .collect();
    panels
        .par_iter()
        .zip(&first_of_file)
        .map(|(p, &first)| {
            let (header, columns) =
                data::device_data(p.name, p.snapshot, p.device, p.parts, host[first].as_ref());
            PanelData {
                name: p.name.to_owned(),
                device: p.device,
                oom: has_oom(p.snapshot, p.device),
                header: serde_json::to_vec(&header).unwrap_or_else(|_| b"{}".to_vec()),
                columns,
            }
        })
        .collect()
}

fn has_oom(snapshot: &Snapshot, device: i64) -> bool {
    snapshot
        .trace(device)
        .iter()
        .any(|e| e.action == Action::Oom)
}

/// The whole page: `title`, the report (Markdown from `report_markdown`, which runs while the
/// panels' data is gathered), the panels and the section the page opens on: a job's
/// `overview` ([`data::overview`]) or a `compare` of two runs ([`data::compare`]).
pub fn page(
    title: &str,
    report_markdown: impl FnOnce() -> String + Send,
    panels: &[Panel],
    section: Option<(&str, serde_json::Value)>,
) -> Vec<u8> {
    let mut timer = crate::timing::Timer::new();
    let (report_html, devices) = rayon::join(
        || markdown::to_html(&report_markdown()),
        || panel_data(panels),
    );
    timer.lap("the page's data");
    assemble(title, &report_html, devices, section)
}

/// [`page`] from the panels' data made before (a job's, file by file, each snapshot let go
/// once its panels were made) and the report in Markdown.
pub fn page_of_data(
    title: &str,
    report_markdown: &str,
    devices: Vec<PanelData>,
    section: Option<(&str, serde_json::Value)>,
) -> Vec<u8> {
    assemble(title, &markdown::to_html(report_markdown), devices, section)
}

fn assemble(
    title: &str,
    report_html: &str,
    devices: Vec<PanelData>,
    section: Option<(&str, serde_json::Value)>,
) -> Vec<u8> {
    let mut timer = crate::timing::Timer::new();
    // The blob: u32 header length, the header (JSON), then every column back to back. The
    // header is written as text: the panels' headers with where their columns lie added.
    let mut header_bytes = Vec::new();
    header_bytes.extend_from_slice(b"{\"title\":");
    write_json(&mut header_bytes, &title);
    header_bytes.extend_from_slice(b",\"legend\":");
    write_json(&mut header_bytes, &data::legend());
    header_bytes.extend_from_slice(b",\"devices\":[");
    let mut columns = Vec::with_capacity(devices.len());
    let mut offset = 0usize;
    for (i, d) in devices.into_iter().enumerate() {
        let PanelData {
            header,
            columns: cols,
            ..
        } = d;
        let entries: serde_json::Map<String, serde_json::Value> = cols
            .names
            .iter()
            .zip(&cols.bytes)
            .map(|(name, bytes)| {
                let entry = json!([offset, bytes.len()]);
                offset += bytes.len();
                ((*name).to_owned(), entry)
            })
            .collect();
        if i > 0 {
            header_bytes.push(b',');
        }
        // `{…}` becomes `{…,"columns":{…}}`.
        let body = header.strip_suffix(b"}").unwrap_or(b"{");
        header_bytes.extend_from_slice(body);
        if body.len() > 1 {
            header_bytes.push(b',');
        }
        header_bytes.extend_from_slice(b"\"columns\":");
        write_json(&mut header_bytes, &entries);
        header_bytes.push(b'}');
        columns.push(cols.bytes);
    }
    header_bytes.push(b']');
    if let Some((name, value)) = section {
        header_bytes.push(b',');
        write_json(&mut header_bytes, &name);
        header_bytes.push(b':');
        write_json(&mut header_bytes, &value);
    }
    header_bytes.push(b'}');
    let mut blob = Vec::with_capacity(4 + header_bytes.len() + offset);
    blob.extend_from_slice(&(header_bytes.len() as u32).to_le_bytes());
    blob.extend_from_slice(&header_bytes);
    drop(header_bytes);
    for bytes in columns {
        for b in bytes {
            blob.extend_from_slice(&b);
        }
    }
    let chunks: Vec<String> = blob.par_chunks(CHUNK).map(|c| base64(&gzip(c))).collect();
    drop(blob);
    timer.lap("the page's data compressed");

    let mut out =
        String::with_capacity(chunks.iter().map(|c| c.len() + 64).sum::<usize>() + (1 << 20));
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str(&format!(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
    ));
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str(&format!("<title>{}</title>\n", markdown::esc(title)));
    out.push_str("<style>\n");
    out.push_str(STYLE);
    out.push_str("</style>\n</head>\n<body>\n");
    out.push_str(&format!(
        "<header><h1>{}</h1><nav><a href=\"#views\">Timeline &amp; segments</a> · <a href=\"#report\">Report</a></nav></header>\n",
        markdown::esc(title)
    ));
    out.push_str("<main>\n<section id=\"views\"><p class=\"loading\" id=\"loading\">Decoding the snapshot…</p></section>\n");
    out.push_str("<section id=\"report\">\n");
    out.push_str(report_html);
    out.push_str("</section>\n</main>\n");
    for c in &chunks {
        out.push_str(
            "<script type=\"application/x-snapscan-gzip-base64\" class=\"snapscan-data\">",
        );
        out.push_str(c);
        out.push_str("</script>\n");
    }
    out.push_str("<script>\n");
    out.push_str(&script_text(SCRIPT));
    out.push_str("</script>\n</body>\n</html>\n");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar\xff"), "Zm9vYmFy/w==");
    }
}
