//! The macro that turns every case of [`cases`](super::cases) into a test.

/// Expands to one `#[test]` per Store test case, on the backend produced by `$builder`
/// (an async expression whose output is an `Arc<dyn Kv>` or an `(Arc<dyn Kv>, guard)`
/// pair; see [`testing`](crate::testing)). Usable from any crate with `rdzv-store`'s
/// `testing` feature; call it inside its own module if the test names could clash.
#[macro_export]
macro_rules! store_suite {
    ($builder:expr) => {
        $crate::store_suite!(@cases $builder;
            // Plain keys.
            keys: set_then_get,
                  set_overwrites,
                  get_blocks_until_set,
                  get_before_any_key_of_the_prefix_exists,
                  get_times_out_on_time_naming_the_key,
                  multi_set_then_multi_get,
                  multi_get_blocks_until_all_exist,
                  multi_get_times_out_naming_the_missing_keys,
                  wait_returns_once_all_keys_exist,
                  wait_times_out_naming_the_missing_keys,
                  check_tells_whether_all_exist,
                  delete_key_tells_whether_it_existed,
                  num_keys_and_list_keys_count_user_keys_only,
                  binary_keys_and_values_round_trip,
                  large_values_round_trip,
                  timeouts_belong_to_each_handle;
            // Counters and compare-and-set.
            counter: add_counts_from_zero_in_decimal_text,
                     add_on_a_set_number,
                     add_on_a_non_number_fails,
                     add_overflow_fails,
                     concurrent_adds_lose_nothing,
                     append_creates_then_extends,
                     concurrent_appends_lose_nothing,
                     compare_set_follows_c10d_rules,
                     compare_set_checked_reports_success,
                     concurrent_compare_set_has_one_winner;
            // Queues.
            queue: queue_is_fifo,
                   queue_pop_on_empty_without_block_is_queue_empty,
                   queue_pop_blocks_until_push,
                   queue_pop_times_out,
                   queue_push_wakes_exactly_one_pop,
                   queue_items_popped_once_by_8_poppers,
                   queues_are_apart_from_keys_and_each_other;
            // Barriers.
            barrier: barrier_of_64_tasks,
                     barrier_can_be_reused,
                     barrier_times_out_naming_the_key,
                     barrier_rejects_a_zero_world_size;
            // Prefixes and isolation.
            prefix: prefix_store_maps_keys_under_its_prefix,
                    prefix_stores_nest,
                    prefix_store_is_isolated,
                    stores_with_other_roots_are_isolated;
        );
    };
    (@cases $builder:expr; $($module:ident: $($case:ident),+;)*) => {
        $($(
            #[test]
            fn $case() {
                $crate::testing::run_case(
                    ::core::stringify!($case),
                    || $builder,
                    $crate::testing::cases::$module::$case,
                );
            }
        )+)*
    };
}
