//! The cache of compiled constraints.

use super::vocabulary;
use crate::ConstraintSpec;
use crate::compiled::{CAPACITY, CompiledCache};

#[test]
fn the_least_recently_used_goes_first() {
    let (vocabulary, _) = vocabulary();
    let matcher = vocabulary.fresh_matcher(&ConstraintSpec::Regex("a".into())).unwrap();
    let mut cache = CompiledCache::default();
    for i in 0..CAPACITY {
        cache.insert(i.to_string(), &matcher);
    }
    assert!(cache.get("0").is_some());
    cache.insert("new".into(), &matcher);
    assert_eq!(cache.len(), CAPACITY);
    assert!(cache.get("0").is_some(), "used last, kept");
    assert!(cache.get("1").is_none(), "the least recently used was dropped");
    assert!(cache.get("new").is_some());
}
