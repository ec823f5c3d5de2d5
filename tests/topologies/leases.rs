//! Issue 34 on a 3-node Redis Cluster: two servers leasing one caller's
//! budget admit at most its limit, and what they leave unspent is all
//! they under-admit.

use std::num::NonZeroU32;

use crate::shared_cluster;
use crate::support::conformance::T0;
use crate::support::redis::unique_prefix;
use tollgate::clock::ManualClock;
use tollgate::store::Leases;
use tollgate::{Key, Policy, Quota, RedisStore, Store};

async fn server(prefix: &str, clock: &ManualClock, leases: Option<Leases>) -> RedisStore {
    let builder = RedisStore::cluster(shared_cluster().urls())
        .connect()
        .await
        .unwrap()
        .prefix(prefix)
        .clock(clock.clone());
    match leases {
        Some(leases) => builder.leases(leases),
        None => builder,
    }
    .build()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leasing_servers_on_a_cluster_admit_at_most_the_limit() {
    let (prefix, clock) = (unique_prefix("cluster-lease"), ManualClock::new(T0));
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(50).unwrap()));
    let leases = Leases::new().hot_after(NonZeroU32::new(4).unwrap());
    let servers = [
        server(&prefix, &clock, Some(leases.clone())).await,
        server(&prefix, &clock, Some(leases)).await,
    ];
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let (server, policy) = (servers[i % 2].clone(), policy.clone());
            tokio::spawn(async move {
                let hot = Key::new("hot");
                let decided = match server.check_now(&policy, &hot, 1) {
                    Some(decided) => decided,
                    None => server.check(&policy, &hot, 1).await,
                };
                decided.unwrap().allowed
            })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        admitted += u64::from(call.await.unwrap());
    }
    assert!(admitted <= 50, "admitted {admitted} of a limit of 50");

    let reader = server(&prefix, &clock, None).await;
    let hot = Key::new("hot");
    let charged = reader.peek(&policy, &hot).await.unwrap().used;
    let unspent = servers[0].return_leases().await + servers[1].return_leases().await;
    assert_eq!(charged, admitted + unspent);
    assert_eq!(reader.peek(&policy, &hot).await.unwrap().used, admitted);
    assert!(
        50 - admitted <= unspent,
        "under-admitted more than the leases held"
    );
    eprintln!("cluster, two servers, 200 requests, limit 50: admitted {admitted}, unspent leases given back {unspent}");
}
