//! Reading the keys of a JSON file into the serde structs of this module, with errors
//! that name the dotted key and what was expected.
//!
//! Every key of those structs is an `Option`: a missing key and `null` both read as
//! absent (as in transformers), and the mapping to our configs decides what is required
//! and what the family's default is. serde checks the types; `serde_path_to_error`
//! gives the key a type error happened at, nested keys dotted (`rope_scaling.factor`).

use std::path::Path;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::error::HfError;

/// A key of a JSON file that is missing or holds the wrong value; the file is added by
/// [`KeyError::in_file`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeyError {
    /// The key, dotted for nested ones; `(root)` for the whole document.
    pub(crate) key: String,
    /// What was expected.
    pub(crate) reason: String,
}

impl KeyError {
    pub(crate) fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The [`HfError::Field`] of this key in the file `path`.
    pub(crate) fn in_file(self, path: &Path) -> HfError {
        HfError::Field {
            path: path.to_path_buf(),
            field: self.key,
            reason: self.reason,
        }
    }
}

/// Reads and parses the JSON file `path`.
///
/// # Errors
/// [`HfError::Io`] naming the file; [`HfError::Json`] with the parser's line and column.
pub(crate) fn read_json(path: &Path) -> Result<Value, HfError> {
    let text = std::fs::read_to_string(path).map_err(|source| HfError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| HfError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Deserializes `T` from `value`, the object found at `prefix` (`None` for the whole
/// document): errors name the key below it, dotted.
pub(crate) fn read_keys<'a, T: Deserialize<'a>>(
    value: &'a Value,
    prefix: Option<&str>,
) -> Result<T, KeyError> {
    // serde would also read a struct from a list of its fields in order; a
    // `config.json` object is never written that way.
    if !value.is_object() {
        return Err(KeyError::new(
            prefix.unwrap_or("(root)"),
            format!("expected a JSON object, got {value}"),
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        // An empty path prints as ".": the error is about the object itself.
        let key = match (prefix, path.as_str()) {
            (None, ".") => "(root)".to_string(),
            (None, _) => path,
            (Some(prefix), ".") => prefix.to_string(),
            (Some(prefix), _) => format!("{prefix}.{path}"),
        };
        KeyError::new(key, error.into_inner().to_string())
    })
}

/// The value of a key the mapping cannot do without.
pub(crate) fn required<T>(value: Option<T>, key: &str, expected: &str) -> Result<T, KeyError> {
    value.ok_or_else(|| KeyError::new(key, format!("missing ({expected} is required)")))
}

/// `layer_types` of a family whose layers are of two kinds, `full_attention` and `kind`
/// (`sliding_attention`, `chunked_attention`, `linear_attention`): for each layer, whether
/// it is of `kind`.
///
/// # Errors
/// A list of another length than `n_layers`, or a third kind, named with the two expected.
pub(crate) fn layers_of_kind(
    types: &[String],
    n_layers: usize,
    kind: &str,
) -> Result<Vec<bool>, KeyError> {
    let key = "layer_types";
    if types.len() != n_layers {
        return Err(KeyError::new(
            key,
            format!("has {} entries for {n_layers} layers", types.len()),
        ));
    }
    types
        .iter()
        .map(|layer| match layer.as_str() {
            "full_attention" => Ok(false),
            layer if layer == kind => Ok(true),
            other => Err(KeyError::new(
                key,
                format!("expected \"{kind}\" or \"full_attention\", got \"{other}\""),
            )),
        })
        .collect()
}

/// The keys of a `config.json` that the family's transformers implementation does not
/// read (or reads and never uses) where the file gives them a value other than the one
/// that implementation computes with. The model follows transformers, the reference
/// checkpoints are made and checked with; these notes tell the reader of the file what
/// it asked for in vain.
#[derive(Debug)]
pub(crate) struct UnreadKeys<'a> {
    config: &'a Value,
    family: &'a str,
    notes: Vec<String>,
}

impl<'a> UnreadKeys<'a> {
    /// Notes on the keys of `config`, read as the family `family`.
    pub(crate) fn new(config: &'a Value, family: &'a str) -> Self {
        Self {
            config,
            family,
            notes: Vec::new(),
        }
    }

    /// `used`, what transformers' implementation of the family computes with whatever
    /// the file says; `value` (the file's value of `key`, a nested one written with
    /// dots: `attn_config.qk_ln`) is noted where it differs, `what` saying in words what
    /// is used instead.
    pub(crate) fn fixed<T: PartialEq>(
        &mut self,
        key: &str,
        value: Option<T>,
        used: T,
        what: &str,
    ) -> T {
        if value.is_some_and(|value| value != used) {
            let written = self
                .config
                .pointer(&format!("/{}", key.replace('.', "/")))
                .map_or_else(String::new, Value::to_string);
            self.notes.push(format!(
                "`{key}: {written}` has no effect in transformers' {}, which uses {what}: \
                 ignored",
                self.family
            ));
        }
        used
    }

    /// The notes, in the order the keys were read.
    pub(crate) fn into_notes(self) -> Vec<String> {
        self.notes
    }
}

/// `eos_token_id`: one token id or a list of them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TokenIds(pub(crate) Vec<u32>);

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TokenIdsVisitor;

        impl<'de> Visitor<'de> for TokenIdsVisitor {
            type Value = TokenIds;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a token id or a list of token ids")
            }

            fn visit_u64<E: de::Error>(self, id: u64) -> Result<TokenIds, E> {
                u32::try_from(id)
                    .map(|id| TokenIds(vec![id]))
                    .map_err(|_| E::custom(format!("{id} does not fit a token id")))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<TokenIds, A::Error> {
                let mut ids = Vec::new();
                while let Some(id) = items.next_element::<u32>()? {
                    ids.push(id);
                }
                Ok(TokenIds(ids))
            }
        }

        deserializer.deserialize_any(TokenIdsVisitor)
    }
}

/// A non-negative integer that may be written as a float with no fractional part
/// (`4096.0`), as some `rope_scaling` objects write their context lengths.
pub(crate) fn whole_number<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<usize>, D::Error> {
    match Option::<f64>::deserialize(deserializer)? {
        None => Ok(None),
        Some(value) if value >= 0.0 && value.fract() == 0.0 && value <= usize::MAX as f64 => {
            Ok(Some(value as usize))
        }
        Some(value) => Err(serde::de::Error::custom(format!(
            "expected a non-negative integer, got {value}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Debug)]
    struct Outer {
        size: Option<usize>,
        inner: Option<Inner>,
        #[serde(default, deserialize_with = "whole_number")]
        length: Option<usize>,
    }

    #[derive(Deserialize, Debug)]
    struct Inner {
        factor: Option<f64>,
    }

    fn error(json: Value, prefix: Option<&str>) -> KeyError {
        read_keys::<Outer>(&json, prefix).unwrap_err()
    }

    #[test]
    fn type_errors_name_the_dotted_key_and_what_was_expected() {
        let wide = error(serde_json::json!({"size": "wide"}), None);
        assert_eq!(wide.key, "size");
        assert!(wide.reason.contains("expected usize"), "{}", wide.reason);
        let nested = error(serde_json::json!({"inner": {"factor": "2"}}), None);
        assert_eq!(nested.key, "inner.factor");
        assert!(nested.reason.contains("expected f64"), "{}", nested.reason);
        let prefixed = error(serde_json::json!({"size": -1}), Some("rope_scaling"));
        assert_eq!(prefixed.key, "rope_scaling.size");
        let root = error(serde_json::json!([1, 2]), None);
        assert_eq!(root.key, "(root)");
        assert!(root.reason.contains("a JSON object"), "{}", root.reason);
        assert_eq!(error(serde_json::json!(3), Some("inner")).key, "inner");
    }

    #[test]
    fn null_reads_as_absent_and_whole_floats_as_integers() {
        let json = serde_json::json!({"size": null, "inner": null, "length": 4096.0});
        let outer: Outer = read_keys(&json, None).unwrap();
        assert!(outer.size.is_none() && outer.inner.is_none());
        assert_eq!(outer.length, Some(4096));
        let json = serde_json::json!({"inner": {"factor": 2}});
        let outer: Outer = read_keys(&json, None).unwrap();
        assert_eq!(outer.inner.and_then(|inner| inner.factor), Some(2.0));
        let fraction = error(serde_json::json!({"length": 1.5}), None);
        assert_eq!(fraction.key, "length");
        assert!(
            fraction.reason.contains("non-negative integer"),
            "{}",
            fraction.reason
        );
        let missing = required::<usize>(None, "hidden_size", "a non-negative integer");
        assert_eq!(
            missing,
            Err(KeyError::new(
                "hidden_size",
                "missing (a non-negative integer is required)"
            ))
        );
    }
}
