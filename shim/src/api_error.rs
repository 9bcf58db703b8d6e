//! A request's failure as the shim answers it (`pb::Error`), and the message of an error chain.

use crate::pb::ErrorCode;

/// A request's failure, sent to the daemon as `pb::Error`.
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }
    pub(crate) fn not_found(id: &str) -> Self {
        Self::new(ErrorCode::NotFound, format!("no container {id:?} in this shim"))
    }
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
    pub(crate) fn precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::FailedPrecondition, message)
    }
}

pub(crate) use scute_sys::errors::chain;
