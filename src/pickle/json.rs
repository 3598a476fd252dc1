//! The JSON form of a snapshot (same dict, as the 2026 web viewer accepts) into a [`Document`].

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::reader::{Budget, BYTES_PER_INPUT_BYTE};
use super::value::{DictId, Document, SeqId, Value};
use super::PickleError;

/// Parses JSON text straight into the same arena the pickle reader fills, under the same
/// memory budget (a JSON value tree first took ~50 bytes per value: 10 MB of `[0,0,…]` needed
/// more than 256 MB). serde_json bounds nesting depth (128), so the recursion is bounded too.
pub fn parse_json(data: &[u8]) -> Result<Document, PickleError> {
    let mut doc = Document::default();
    let mut budget = Budget::new(data.len());
    let mut de = serde_json::Deserializer::from_slice(data);
    let root = ValueSeed {
        doc: &mut doc,
        budget: &mut budget,
    }
    .deserialize(&mut de)
    .and_then(|root| de.end().map(|()| root))
    .map_err(|e| PickleError::Json(e.to_string()))?;
    doc.root = Some(root);
    Ok(doc)
}

/// Deserializes one JSON value into `doc`.
struct ValueSeed<'d> {
    doc: &'d mut Document,
    budget: &'d mut Budget,
}

impl ValueSeed<'_> {
    fn charge<E: de::Error>(&mut self, bytes: u64) -> Result<(), E> {
        self.budget.add(bytes);
        self.check()
    }

    fn check<E: de::Error>(&self) -> Result<(), E> {
        if self.budget.over() {
            Err(E::custom(format!(
                "the values read so far take more than {} MiB ({BYTES_PER_INPUT_BYTE} bytes \
                 per input byte), far more than a memory snapshot of this size needs: the JSON \
                 is made of tiny containers or values",
                self.budget.limit() >> 20
            )))
        } else {
            Ok(())
        }
    }

    fn str<E: de::Error>(&mut self, s: &str) -> Result<Value, E> {
        let id = self.budget.intern(&mut self.doc.strings, s);
        self.check()?;
        Ok(Value::Str(id))
    }
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::None)
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Value, E> {
        Ok(Value::Int(i))
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Value, E> {
        Ok(match i64::try_from(u) {
            Ok(i) => Value::Int(i),
            Err(_) => {
                self.doc.big_ints.push(u as i128);
                Value::BigInt(self.doc.big_ints.len() as u32 - 1)
            }
        })
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        Ok(Value::Float(f))
    }

    fn visit_str<E: de::Error>(mut self, s: &str) -> Result<Value, E> {
        self.str(s)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Value, A::Error> {
        self.charge(Budget::CONTAINER)?;
        let mut values = Vec::new();
        while let Some(v) = seq.next_element_seed(ValueSeed {
            doc: &mut *self.doc,
            budget: &mut *self.budget,
        })? {
            self.charge(Budget::VALUE)?;
            values.push(v);
        }
        self.doc.seqs.push(values);
        Ok(Value::List(SeqId(self.doc.seqs.len() as u32 - 1)))
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Value, A::Error> {
        self.charge(Budget::CONTAINER)?;
        let mut pairs: Vec<(String, Value)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            self.charge(2 * Budget::VALUE)?;
            let value = map.next_value_seed(ValueSeed {
                doc: &mut *self.doc,
                budget: &mut *self.budget,
            })?;
            pairs.push((key, value));
        }
        // As serde_json's own map had them: sorted by key, the last of equal keys kept.
        pairs.reverse();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs.dedup_by(|later, earlier| later.0 == earlier.0);
        let mut items = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            items.push((self.str(&k)?, v));
        }
        self.doc.dicts.push(items);
        Ok(Value::Dict(DictId(self.doc.dicts.len() as u32 - 1)))
    }
}
