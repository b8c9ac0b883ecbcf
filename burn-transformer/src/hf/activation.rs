//! The `hidden_act` / `activation_function` names of transformers' `ACT2FN`, mapped to
//! our [`Activation`].

use serde::{Deserialize, Deserializer};

use crate::ffn::Activation;

/// The activation a Hugging Face name stands for, or why there is none.
pub(crate) fn activation(name: &str) -> Result<Activation, String> {
    match name {
        "gelu" => Ok(Activation::Gelu),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" | "gelu_python_tanh" => {
            Ok(Activation::GeluTanh)
        }
        "relu" => Ok(Activation::Relu),
        "relu2" => Ok(Activation::Relu2),
        "silu" | "swish" => Ok(Activation::Silu),
        "xielu" => Ok(Activation::Xielu),
        other => Err(format!(
            "unsupported activation \"{other}\" (expected gelu, gelu_new, gelu_pytorch_tanh, \
             gelu_fast, relu, relu2, silu, swish or xielu)"
        )),
    }
}

/// serde's reader of an optional activation name (`#[serde(deserialize_with)]`).
pub(crate) fn deserialize_activation<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Activation>, D::Error> {
    match Option::<String>::deserialize(deserializer)? {
        None => Ok(None),
        Some(name) => activation(&name)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::keys::read_keys;

    #[test]
    fn reads_hugging_face_names() {
        assert_eq!(activation("gelu"), Ok(Activation::Gelu));
        assert_eq!(activation("gelu_pytorch_tanh"), Ok(Activation::GeluTanh));
        assert_eq!(activation("swish"), Ok(Activation::Silu));
        assert_eq!(activation("relu2"), Ok(Activation::Relu2));
        assert!(activation("quick_gelu").is_err());

        #[derive(Deserialize)]
        struct Keys {
            #[serde(default, deserialize_with = "deserialize_activation")]
            hidden_act: Option<Activation>,
        }
        let json = serde_json::json!({"hidden_act": "quick_gelu"});
        let error = read_keys::<Keys>(&json, None).err().unwrap();
        assert_eq!(error.key, "hidden_act");
        assert!(error.reason.contains("\"quick_gelu\""), "{}", error.reason);
        let json = serde_json::json!({"hidden_act": "relu"});
        let keys: Keys = read_keys(&json, None).unwrap();
        assert_eq!(keys.hidden_act, Some(Activation::Relu));
    }
}
