//! Any bytes as the body of `/v1/completions` and of `/v1/chat/completions`: the HTTP API's
//! checks up to the prompt (`check_request`: JSON, known fields, their types, the translation
//! to a GenerateRequest) return a value or an error, never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use specd_coordinator::api::http::{Endpoint, check_request};

fuzz_target!(|body: &[u8]| {
    for endpoint in [Endpoint::Completions, Endpoint::Chat] {
        let _ = check_request(endpoint, body);
    }
});
