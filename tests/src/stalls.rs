//! Scenarios of turns that make no progress: the model gateway down, a gateway that sends
//! headers and then stalls, rate limits (issue 10, point 1).
