//! A model loaded with `logits_on_device` returns its logits in a tensor, uncopied, and
//! they are the numbers the host path copies out: one session's pass, a batched pass split
//! by session, and a table model's rows.

mod common;

use common::{cpu_f32, fixture};
use specd_model::{ForwardItem, LanguageModel, LlamaModel, LoadOptions, TableModel};

#[test]
fn a_llama_leaves_its_logits_in_a_tensor_with_the_same_numbers() {
    let path = fixture("llama_gqa_untied");
    let mut host = LlamaModel::load(&path, &cpu_f32()).unwrap();
    let mut kept = LlamaModel::load(&path, &LoadOptions { logits_on_device: true, ..cpu_f32() }).unwrap();
    let (a, b) = (host.open_session(None).unwrap(), kept.open_session(None).unwrap());
    let on_host = host.forward_last(a, &[5, 9, 17, 4], 3).unwrap();
    let in_tensor = kept.forward_last(b, &[5, 9, 17, 4], 3).unwrap();
    assert!(on_host.on_host() && !in_tensor.on_host());
    assert_eq!((in_tensor.rows(), in_tensor.vocab()), (3, on_host.vocab()));
    assert!(in_tensor.row(0).is_none(), "rows are read on the host only");
    assert_eq!(in_tensor.clone().into_host().unwrap(), on_host);
    assert_eq!(in_tensor, on_host);

    // A batched pass of two sessions: each gets its own rows.
    let (c, d) = (host.open_session(None).unwrap(), kept.open_session(None).unwrap());
    let items = |first, second| {
        [
            ForwardItem { session: first, tokens: &[7, 8][..], rows: 1 },
            ForwardItem { session: second, tokens: &[3, 1, 4][..], rows: 3 },
        ]
    };
    let on_host = host.forward_batch(&items(a, c));
    let in_tensor = kept.forward_batch(&items(b, d));
    for (h, t) in on_host.into_iter().zip(in_tensor) {
        let (h, t) = (h.unwrap(), t.unwrap());
        assert!(!t.on_host());
        assert_eq!(t.into_host().unwrap(), h);
    }
}

#[test]
fn a_table_model_puts_its_rows_in_a_cpu_tensor_when_asked() {
    let file = serde_json::json!({"vocab_size": 3, "default": [0.2, 0.3, 0.5], "rules": []});
    let mut plain = TableModel::from_json("t", file.clone(), None).unwrap();
    let mut kept = TableModel::from_json("t", file, None).unwrap().with_logits_in_tensors(true);
    let (a, b) = (plain.open_session(None).unwrap(), kept.open_session(None).unwrap());
    let on_host = plain.forward(a, &[0, 1]).unwrap();
    let in_tensor = kept.forward(b, &[0, 1]).unwrap();
    assert!(!in_tensor.on_host());
    assert_eq!(in_tensor.into_host().unwrap(), on_host);
}
