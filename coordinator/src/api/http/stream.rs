//! A generation streamed as server-sent events: one chunk per committed round that adds text
//! (the chat stream opens with the assistant's role), the finish reason and stats on the last,
//! the usage chunk when asked, then `data: [DONE]`. An error after the stream began is sent
//! as an event in OpenAI's error shape, and the stream ends.
//!
//! Where the request offered tools, a round's text goes through its [`CallReader`] first: text
//! that may begin a call is held back until it is known not to, and each call is sent, once
//! complete, as OpenAI's two tool-call deltas.
//!
//! The events go through a task of their own, which drops the generation as soon as the
//! client's connection is gone: the session actor sees its client leave and frees both nodes'
//! sessions.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use specd_proto::v1::GenerateResponse;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};

use super::body::Endpoint;
use super::calls::CallReader;
use super::error::ApiError;
use super::respond::{LogprobFormat, Shape};

type Events = Sse<axum::response::sse::KeepAliveStream<ReceiverStream<Result<Event, Infallible>>>>;

pub fn events(
    mut generation: impl Stream<Item = Result<GenerateResponse, tonic::Status>> + Unpin + Send + 'static,
    shape: impl FnOnce(&str) -> Shape + Send + 'static,
    include_usage: bool,
    mut logprobs: Option<LogprobFormat>,
    mut calls: Option<CallReader>,
) -> Events {
    let (tx, rx) = mpsc::channel(16);
    // The shape needs the request id, which the first message carries; the chunks' `created`
    // is the time the stream began.
    let mut shape = Some(shape);
    tokio::spawn(async move {
        let send = |value: serde_json::Value| {
            let tx = tx.clone();
            async move { tx.send(Ok(Event::default().data(value.to_string()))).await.is_ok() }
        };
        let mut current: Option<Shape> = None;
        let mut usage = None;
        loop {
            let next = tokio::select! {
                next = generation.next() => next,
                () = tx.closed() => return,
            };
            let message = match next {
                None => break,
                Some(Ok(message)) => message,
                Some(Err(status)) => {
                    send(ApiError::from(status).body()).await;
                    return;
                }
            };
            let shape = match (&current, shape.take()) {
                (Some(shape), _) => shape,
                (None, Some(make)) => {
                    let made = make(&message.request_id);
                    if made.endpoint == Endpoint::Chat && !send(made.role_chunk()).await {
                        return;
                    }
                    current.insert(made)
                }
                (None, None) => return,
            };
            usage = message.usage.or(usage);
            let last = message.finish_reason != 0;
            let formatted = logprobs.as_mut().map(|f| f.format(&message.token_ids, &message.logprobs));
            let carries = !message.text.is_empty() || !message.token_ids.is_empty() && formatted.is_some();
            let chunks = match calls.as_mut() {
                None if last || carries => vec![shape.chunk(&message, formatted)],
                None => Vec::new(),
                Some(reader) => {
                    let mut read = reader.push(&message.text);
                    if last {
                        let rest = reader.finish();
                        read.text.push_str(&rest.text);
                        read.calls.extend(rest.calls);
                    }
                    let first_index = reader.calls().len() - read.calls.len();
                    // Log-probabilities come with the tokens that have them.
                    let formatted = formatted.filter(|_| !message.token_ids.is_empty());
                    shape.call_chunks(&message, &read, first_index, !reader.calls().is_empty(), formatted)
                }
            };
            for chunk in chunks {
                if !send(chunk).await {
                    return;
                }
            }
        }
        if let Some(shape) = &current
            && include_usage
            && !send(shape.usage_chunk(usage.as_ref())).await
        {
            return;
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    // A comment line every 15 s while nothing else is sent (a long prompt's pass, text held
    // back for a stop string) keeps proxies from cutting an idle stream.
    Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::default())
}
