//! Scenarios of stopping: SIGTERM stops the runner within 2 s during each CLI's turn and during
//! `ask_user_question` (issue 10, point 2).
