//! usdt
