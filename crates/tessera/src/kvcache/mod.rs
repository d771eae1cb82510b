pub mod block_manager;
