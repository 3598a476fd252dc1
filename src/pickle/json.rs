//! The JSON form of a snapshot (same dict, as the 2026 web viewer accepts) into a [`Document`].

use super::value::{DictId, Document, SeqId, Value};
use super::PickleError;

/// Parses JSON text into the same arena the pickle reader fills. serde_json bounds nesting
/// depth (128), so the recursive conversion below is bounded too.
pub fn parse_json(data: &[u8]) -> Result<Document, PickleError> {
    let json: serde_json::Value =
        serde_json::from_slice(data).map_err(|e| PickleError::Json(e.to_string()))?;
    let mut doc = Document::default();
    let root = convert(&mut doc, &json);
    doc.root = Some(root);
    Ok(doc)
}

fn convert(doc: &mut Document, json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::None,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                doc.big_ints.push(u as i128);
                Value::BigInt(doc.big_ints.len() as u32 - 1)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::Str(doc.strings.intern(s)),
        serde_json::Value::Array(items) => {
            let values: Vec<Value> = items.iter().map(|i| convert(doc, i)).collect();
            doc.seqs.push(values);
            Value::List(SeqId(doc.seqs.len() as u32 - 1))
        }
        serde_json::Value::Object(map) => {
            let pairs: Vec<(Value, Value)> = map
                .iter()
                .map(|(k, v)| {
                    let key = Value::Str(doc.strings.intern(k));
                    (key, convert(doc, v))
                })
                .collect();
            doc.dicts.push(pairs);
            Value::Dict(DictId(doc.dicts.len() as u32 - 1))
        }
    }
}
