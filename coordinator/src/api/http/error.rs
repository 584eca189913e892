//! Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the HTTP
//! status each gRPC status code stands for: the one table from the coordinator's errors to HTTP.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tonic::Code;

/// An error answered to an HTTP client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable reason, as OpenAI's `code` (`model_not_found`, `unsupported_parameter`).
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about the client's request.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), param: param.map(str::to_owned), code: None }
    }

    /// A 400 naming fields that specd cannot honour: never silently ignored.
    pub fn unsupported(fields: &[String]) -> Self {
        let list = fields.join(", ");
        Self {
            status: StatusCode::BAD_REQUEST,
            message: format!("specd does not support {list}; remove {}", if fields.len() == 1 { "it" } else { "them" }),
            param: fields.first().cloned(),
            code: Some("unsupported_parameter"),
        }
    }

    /// A 404 for a model this server does not serve.
    pub fn model_not_found(asked: &str, served: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{asked}` does not exist; this server serves `{served}`"),
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// An error of compiling the request's output constraint names the field it came from
    /// (`response_format`, `tools`, ...); the coordinator's message says what in it is wrong.
    pub fn naming_constraint(mut self, field: Option<&str>) -> Self {
        let about_constraint =
            ["invalid constraint:", "constraint too costly:"].iter().any(|p| self.message.starts_with(p));
        if let (Some(field), true, StatusCode::BAD_REQUEST) = (field, about_constraint, self.status) {
            self.message = format!("{field}: {}", self.message);
            self.param = Some(field.to_owned());
        }
        self
    }

    /// OpenAI's error `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "invalid_request_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
            StatusCode::GATEWAY_TIMEOUT => "timeout_error",
            _ => "server_error",
        }
    }

    /// The JSON body, also sent as the last event of a stream that fails after it started.
    pub fn body(&self) -> serde_json::Value {
        let detail =
            Detail { message: &self.message, kind: self.kind(), param: self.param.as_deref(), code: self.code };
        serde_json::to_value(Body { error: detail }).unwrap_or_default()
    }
}

/// The HTTP status of each gRPC code the coordinator answers with. FAILED_PRECONDITION is
/// the server's state, never the request's (the model's files: a chat template that does not
/// compile, a missing tokenizer file; nodes that cannot work together): a 500, which clients
/// do not mistake for a request to fix.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        Self { status: http_status(status.code()), message: status.message().to_owned(), param: None, code: None }
    }
}

impl From<crate::CoordinatorError> for ApiError {
    fn from(err: crate::CoordinatorError) -> Self {
        tonic::Status::from(err).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_the_coordinator_answers_has_its_http_status() {
        let cases = [
            (Code::InvalidArgument, 400, "invalid_request_error"),
            (Code::Unauthenticated, 401, "authentication_error"),
            (Code::NotFound, 404, "not_found_error"),
            (Code::ResourceExhausted, 429, "rate_limit_error"),
            (Code::Unavailable, 503, "service_unavailable_error"),
            (Code::DeadlineExceeded, 504, "timeout_error"),
            (Code::Internal, 500, "server_error"),
            (Code::FailedPrecondition, 500, "server_error"),
        ];
        for (code, http, kind) in cases {
            let err = ApiError::from(tonic::Status::new(code, "why"));
            assert_eq!(err.status.as_u16(), http, "{code:?}");
            let body = err.body();
            assert_eq!(body["error"]["type"], kind, "{code:?}");
            assert_eq!(body["error"]["message"], "why");
            assert!(body["error"]["param"].is_null() && body["error"]["code"].is_null());
        }
    }

    #[test]
    fn a_constraints_errors_name_its_field() {
        let invalid = ApiError::from(tonic::Status::invalid_argument("invalid constraint: bad schema"));
        let named = invalid.clone().naming_constraint(Some("response_format"));
        assert_eq!(named.param.as_deref(), Some("response_format"));
        assert_eq!(named.message, "response_format: invalid constraint: bad schema");
        assert_eq!(invalid.clone().naming_constraint(None), invalid);
        let other = ApiError::from(tonic::Status::invalid_argument("top_k -1 is negative"));
        assert_eq!(other.clone().naming_constraint(Some("tools")), other);
    }

    #[test]
    fn unsupported_fields_are_named() {
        let err = ApiError::unsupported(&["tools".into(), "echo".into()]);
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        let body = err.body();
        assert_eq!(body["error"]["message"], "specd does not support tools, echo; remove them");
        assert_eq!(body["error"]["param"], "tools");
        assert_eq!(body["error"]["code"], "unsupported_parameter");
    }
}
