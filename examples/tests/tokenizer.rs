//! A Hugging Face `tokenizer.json` (byte-level BPE, written by
//! `tools/make_hf_models.py` with the Python `tokenizers` library) gives the same ids
//! as in Python and decodes back to the text.

use tokenizers::Tokenizer;

#[test]
fn tokenizer_json_round_trips_text_with_python_ids() {
    let dir = examples::manifest_dir().join("../burn-transformer/tests/fixtures/hf/tokenizer");
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let cases = cases.as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_u64().unwrap() as u32)
            .collect();
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ids, expected, "ids of {text:?}");
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
    }
}
