pub mod block_manager;
#[cfg(test)]
mod block_manager_tests;
