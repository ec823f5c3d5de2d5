//! The batch scripts below the store: each decides and writes what its lone
//! script does, call for call, on random traces.

use redis::Commands;

use crate::support::redis::RedisServer;

/// A small deterministic generator (xorshift64*), for decisions that differ
/// by seed and replay the same in every run.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// Before a lone decision script's text: the helpers the store puts first
/// (lua/prelude.lua), and its `dry_run` argument as the store passes it to a
/// charge (lua/timed.lua).
const CHARGING: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    "local dry_run = false\n"
);

/// Lets a script's PEXPIREs be compared exactly: each also SETs
/// `px|<key>` to the milliseconds it was given.
/// A strategy's own batch file (`lua/*_batch.lua`) put together as the
/// store does (see src/store/redis/script.rs), with PEXPIRE recorded.
fn shimmed_batch(own: &str) -> String {
    format!(
        "{PEXPIRE_SHIM}{}{}\n{own}\n{}",
        include_str!("../../lua/prelude.lua"),
        include_str!("../../lua/batch_prelude.lua"),
        include_str!("../../lua/batch.lua")
    )
}

/// Runs a lone script with `keys` and `args`: its reply.
fn eval_alone(conn: &mut redis::Connection, script: &str, keys: &[String], args: &[i64]) -> Reply {
    let reply: redis::RedisResult<Vec<i64>> = redis::cmd("EVAL")
        .arg(script)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query(conn);
    match reply {
        Ok(ints) => Reply::Ints(ints),
        // Before 7.0 an error inside a script comes back as `ERR Error
        // running script ...: WRONGTYPE ...`; from 7.0 with its own code.
        Err(err) if err.to_string().contains("WRONGTYPE") => Reply::Error("WRONGTYPE".to_owned()),
        Err(err) => Reply::Error(err.code().unwrap_or("?").to_owned()),
    }
}

/// Runs `decisions` (each its keys and arguments) in one call of `batch`,
/// encoded as the store encodes them (lua/batch.lua): a decision with the
/// keys and arguments of the one before but for its request id (at
/// `id_at(args)`) sends `#` and the id alone, one with all of them `=`;
/// any other sends it all. The replies, how many decisions went by their
/// id alone and how many as `=`.
fn eval_batch(
    conn: &mut redis::Connection,
    batch: &str,
    decisions: &[(Vec<String>, Vec<i64>)],
    id_at: impl Fn(&[i64]) -> Option<usize>,
) -> (Vec<Reply>, usize, usize) {
    // No deadline ("0"): see lua/batch.lua's ARGV[2].
    let (mut keys, mut args) = (
        Vec::new(),
        vec![decisions.len().to_string(), "0".to_owned()],
    );
    for (i, (k, a)) in decisions.iter().enumerate() {
        let before = i.checked_sub(1).map(|p| &decisions[p]);
        if before.is_some_and(|(pk, pa)| pk == k && pa == a) {
            args.push("=".to_owned());
            continue;
        }
        let fresh = before.zip(id_at(a)).filter(|((pk, pa), at)| {
            pk == k && pa.len() == a.len() && pa[..*at] == a[..*at] && pa[at + 1..] == a[at + 1..]
        });
        if let Some((_, at)) = fresh {
            args.extend(["#".to_owned(), a[at].to_string()]);
            continue;
        }
        keys.extend(k.iter().cloned());
        args.extend([k.len().to_string(), a.len().to_string()]);
        args.extend(a.iter().map(i64::to_string));
    }
    let fresh = args.iter().filter(|a| *a == "#").count();
    let same = args.iter().filter(|a| *a == "=").count();
    let reply: Vec<u8> = redis::cmd("EVAL")
        .arg(batch)
        .arg(keys.len())
        .arg(&keys)
        .arg(&args)
        .query(conn)
        .unwrap();
    (unpack_batch(&reply), fresh, same)
}

const PEXPIRE_SHIM: &str = "local real = redis\n\
    local redis = setmetatable({ call = function(cmd, ...)\n\
      if cmd == 'PEXPIRE' then real.call('SET', 'px|' .. (select(1, ...)), (select(2, ...))) end\n\
      return real.call(cmd, ...)\n\
    end }, { __index = real })\n";

/// A decision's reply: its integers, or its error's code.
#[derive(Debug, PartialEq)]
enum Reply {
    Ints(Vec<i64>),
    Error(String),
}

/// `lua/batch.lua`'s packed reply, one [`Reply`] per decision.
fn unpack_batch(mut bytes: &[u8]) -> Vec<Reply> {
    let mut replies = Vec::new();
    let take = |n: usize, bytes: &mut &[u8]| {
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        head.to_vec()
    };
    while !bytes.is_empty() {
        let n = u16::from_be_bytes(take(2, &mut bytes).try_into().unwrap()) as usize;
        if n == 0 {
            let len = u16::from_be_bytes(take(2, &mut bytes).try_into().unwrap()) as usize;
            let message = String::from_utf8(take(len, &mut bytes)).unwrap();
            replies.push(Reply::Error(message.split(' ').next().unwrap().to_owned()));
        } else {
            let ints = (0..n)
                .map(|_| i64::from_be_bytes(take(8, &mut bytes).try_into().unwrap()))
                .collect();
            replies.push(Reply::Ints(ints));
        }
    }
    replies
}

/// One sliding-log decision below the store: its keys (under a prefix) and
/// lua/sliding_log.lua's arguments (now, cost, request id, the resource's
/// limit and window, the consumer's).
type LogDecision = ([String; 2], [i64; 7]);

/// Random sliding-log calls for [`the_sliding_log_batch_decides_and_writes_what_its_lone_script_does`]:
/// each call's clock, some decisions on clocks of their own (a microsecond
/// on, seconds back, a window on, or one that keeps the cutoff with a
/// longer window), costs from a look to hundreds of units (several ZADDs),
/// one or two resources, and up to four callers, with "bad" among them if
/// `bad`.
fn random_log_calls(dice: &mut Dice, bad: bool) -> Vec<Vec<LogDecision>> {
    let mut callers: Vec<String> = (0..=dice.below(4)).map(|i| format!("c{i}")).collect();
    if bad {
        callers.push("bad".to_owned());
    }
    let resources = if dice.one_in(3) {
        &["r1", "r2"][..]
    } else {
        &["r1"][..]
    };
    let mut clock: i64 = 1_800_000_000_000_000;
    let mut id: i64 = 1_000_000_000_000;
    let mut calls = Vec::new();
    for _ in 0..=dice.below(8) {
        clock += dice.pick(&[0, 1, 500_000, 3_000_000, 10_000_000, -5_000_000, 30_000_000]);
        let mut decisions = Vec::new();
        for _ in 0..=dice.below(40) {
            let mut now = clock;
            if dice.below(100) < 15 {
                now += dice.pick(&[1, -1, 2_000_000, -7_000_000, 11_000_000]);
            }
            let resource = dice.pick(resources);
            let mut limits = [
                if resource == "r1" {
                    dice.pick(&[5, 8, 20])
                } else {
                    6
                },
                dice.pick(&[3, 4, 10, 1000]),
            ];
            let mut windows = [
                dice.pick(&[10_000_000, 10_000_000, 4_000_000, 3_000_000]),
                dice.pick(&[10_000_000, 7_000_000]),
            ];
            let cost = if dice.one_in(10) {
                limits = [1000, 1000];
                dice.below(700) as i64
            } else {
                dice.pick(&[0, 1, 1, 1, 2, 3, 12])
            };
            if dice.one_in(10) {
                // The cutoff of the call's clock with a 10 s window.
                let later = dice.pick(&[1, 1_000_000, 2_500_000]);
                now = clock + later;
                windows = [10_000_000 + later; 2];
            }
            id += 1 + dice.below(1000) as i64;
            let caller = &callers[dice.below(callers.len() as u64) as usize];
            let keys = [resource.to_owned(), format!("consumer:{caller}")];
            let args = [now, cost, id, limits[0], windows[0], limits[1], windows[1]];
            decisions.push((keys, args));
        }
        calls.push(decisions);
    }
    calls
}

#[test]
fn the_sliding_log_batch_decides_and_writes_what_its_lone_script_does() {
    // Below the store, where each call's decisions are chosen: lone
    // lua/sliding_log.lua, one decision after the other, under "a:", against
    // calls of lua/sliding_log_batch.lua (as the store builds it, see
    // src/store/redis/script.rs) under "b:". Every reply, every member and
    // score, and every PEXPIRE's milliseconds must be the same.
    let server = RedisServer::start();
    let mut conn = server.conn();
    let lone = format!(
        "{PEXPIRE_SHIM}{CHARGING}{}",
        include_str!("../../lua/sliding_log.lua")
    );
    let batch = shimmed_batch(include_str!("../../lua/sliding_log_batch.lua"));
    // First, by hand: a log whose entries lie ahead of the call's clock (an
    // app server's clock ahead of another's). A rejection waits on the
    // oldest, 5 s ahead; a pass then adds one older still, which the next
    // rejection waits on instead.
    let t: i64 = 1_800_000_000_000_000;
    let keys = || ["r1".to_owned(), "consumer:c0".to_owned()];
    let ahead = vec![
        vec![(
            keys(),
            [t + 5_000_000, 2, 11, 100, 10_000_000, 3, 10_000_000],
        )],
        vec![
            (keys(), [t, 2, 12, 100, 10_000_000, 3, 10_000_000]),
            (keys(), [t, 1, 13, 100, 10_000_000, 3, 10_000_000]),
            (keys(), [t, 1, 14, 100, 10_000_000, 3, 10_000_000]),
        ],
    ];
    // A flood of one caller: each decision differs from the one before in
    // its request id alone, which the batch then sends by itself.
    let flood = (0..3)
        .map(|call| {
            (0..40)
                .map(|i| {
                    (
                        keys(),
                        [
                            t + call,
                            1,
                            100 + call * 40 + i,
                            1000,
                            10_000_000,
                            90,
                            10_000_000,
                        ],
                    )
                })
                .collect()
        })
        .collect();
    let mut cases = vec![(ahead, false), (flood, false)];
    // Then random calls, a third with a caller's log of another type.
    for seed in 1..=60u64 {
        let mut dice = Dice(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let bad = dice.one_in(3);
        cases.push((random_log_calls(&mut dice, bad), bad));
    }
    let (mut decided, mut passed, mut failed, mut fresh_ids) = (0, 0, 0, 0);
    for (case, (calls, bad)) in cases.into_iter().enumerate() {
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
        if bad {
            for side in ["a", "b"] {
                let _: () = conn.rpush(format!("{side}:consumer:bad"), "x").unwrap();
            }
        }
        let (mut alone, mut batched) = (Vec::new(), Vec::new());
        for decisions in calls {
            let mut sent = Vec::new();
            for (k, a) in &decisions {
                let a_keys: Vec<String> = k.iter().map(|k| format!("a:{k}")).collect();
                alone.push(eval_alone(&mut conn, &lone, &a_keys, &a[..]));
                sent.push((k.iter().map(|k| format!("b:{k}")).collect(), a.to_vec()));
            }
            // The request id is the third argument.
            let (replies, fresh, _) = eval_batch(&mut conn, &batch, &sent, |_| Some(2));
            batched.extend(replies);
            fresh_ids += fresh;
        }
        assert_eq!(alone.len(), batched.len(), "case {case}");
        for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
            assert_eq!(a, b, "case {case}, decision {i}");
        }
        decided += alone.len();
        passed += alone
            .iter()
            .filter(|r| matches!(r, Reply::Ints(i) if i[0] == 1))
            .count();
        failed += alone
            .iter()
            .filter(|r| matches!(r, Reply::Error(_)))
            .count();

        let mut names: Vec<String> = conn.keys("a:*").unwrap();
        names.extend(conn.keys::<_, Vec<String>>("b:*").unwrap());
        let mut names: Vec<String> = names.into_iter().map(|n| n[2..].to_owned()).collect();
        names.sort();
        names.dedup();
        for name in names {
            let (a, b) = (format!("a:{name}"), format!("b:{name}"));
            let kind: [String; 2] =
                [&a, &b].map(|k| redis::cmd("TYPE").arg(k).query(&mut conn).unwrap());
            assert_eq!(kind[0], kind[1], "case {case}: {name}");
            if kind[0] == "zset" {
                let members: [Vec<(String, i64)>; 2] =
                    [&a, &b].map(|k| conn.zrange_withscores(k, 0, -1).unwrap());
                assert_eq!(members[0], members[1], "case {case}: {name}");
                let px: [Option<String>; 2] =
                    [&a, &b].map(|k| conn.get(format!("px|{k}")).unwrap());
                assert_eq!(px[0], px[1], "case {case}: {name}'s PEXPIRE");
                let pttl: [i64; 2] =
                    [&a, &b].map(|k| redis::cmd("PTTL").arg(k).query(&mut conn).unwrap());
                assert!(
                    pttl[0] > 0 && (pttl[0] - pttl[1]).abs() < 1000,
                    "case {case}: {name} {pttl:?}"
                );
            }
        }
    }
    // The cases cover what they should: passes, rejections, failures.
    assert!(
        passed > decided / 10 && passed < decided / 2,
        "{passed} of {decided}"
    );
    assert!(failed > 20, "{failed} failed of {decided}");
    assert!(fresh_ids > 50, "{fresh_ids} sent by their id alone");
}

#[test]
fn the_concurrency_batch_with_releases_decides_and_writes_what_its_lone_scripts_do() {
    // lua/concurrency.lua and lua/concurrency_release.lua run one after the
    // other under "a:", against the same decisions and releases in calls of
    // lua/concurrency_batch.lua under "b:", in any order (the store sends a
    // batch's releases first; the script must not rely on it). Releases give
    // back slots taken in earlier calls or in the same one, or never taken.
    // Every reply, member, score and PEXPIRE must be the same.
    let server = RedisServer::start();
    let mut conn = server.conn();
    let lone = format!(
        "{PEXPIRE_SHIM}{CHARGING}{}",
        include_str!("../../lua/concurrency.lua")
    );
    let release = format!(
        "{PEXPIRE_SHIM}{CHARGING}{}",
        include_str!("../../lua/concurrency_release.lua")
    );
    let batch = shimmed_batch(include_str!("../../lua/concurrency_batch.lua"));
    let (mut decided, mut passed, mut released, mut failed) = (0, 0, 0, 0);
    let (mut fresh_ids, mut repeated) = (0, 0);
    for seed in 1..=60u64 {
        let mut dice = Dice(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
        let mut keys = vec!["k1", "k2"];
        if dice.one_in(3) {
            keys.push("bad");
            for side in ["a", "b"] {
                let _: () = conn.rpush(format!("{side}:bad"), "x").unwrap();
            }
        }
        let (mut clock, mut id) = (1_800_000_000_000_000i64, 1i64);
        // Slots taken so far: key, id, cost; and the last slot released,
        // released again at times (a receipt given back twice by hand).
        let mut taken: Vec<(&str, i64, i64)> = Vec::new();
        let mut last_released = None;
        let (mut alone, mut batched) = (Vec::new(), Vec::new());
        for _ in 0..8 {
            let mut call: Vec<(Vec<String>, Vec<i64>)> = Vec::new();
            for _ in 0..=dice.below(12) {
                let (key, script, args) = if dice.one_in(3) && !taken.is_empty() {
                    let (key, id, cost) = match last_released {
                        Some(again) if dice.one_in(3) => again,
                        _ => taken[dice.below(taken.len() as u64) as usize],
                    };
                    let id = if dice.one_in(8) { id + 7_000_000 } else { id };
                    last_released = Some((key, id, cost));
                    (key, &release, vec![id, cost])
                } else {
                    clock += dice.pick(&[0, 0, 0, 1, 1_000_000, 20_000_000]);
                    let (cost, limit) = if dice.one_in(15) {
                        (1200 + dice.below(100) as i64, 2000)
                    } else {
                        (dice.pick(&[0, 1, 1, 1, 2, 3]), dice.pick(&[3, 5]))
                    };
                    let timeout = dice.pick(&[10_000_000, 10_000_000, 5_000_000]);
                    id += 1 + dice.below(100) as i64;
                    let key = keys[dice.below(keys.len() as u64) as usize];
                    (key, &lone, vec![clock, cost, limit, timeout, id])
                };
                let reply = eval_alone(&mut conn, script, &[format!("a:{key}")], &args);
                match (&reply, args.len()) {
                    (Reply::Ints(ints), 5) if ints[0] == 1 && args[1] > 0 => {
                        taken.push((key, args[4], args[1]));
                        passed += 1;
                    }
                    (Reply::Ints(ints), 2) => released += ints[0],
                    (Reply::Error(_), _) => failed += 1,
                    _ => {}
                }
                alone.push(reply);
                call.push((vec![format!("b:{key}")], args));
            }
            decided += call.len();
            // A check's request id is its fifth argument, a release's its first.
            let id_at = |a: &[i64]| Some(if a.len() == 5 { 4 } else { 0 });
            let (replies, fresh, same) = eval_batch(&mut conn, &batch, &call, id_at);
            batched.extend(replies);
            fresh_ids += fresh;
            repeated += same;
        }
        assert_eq!(alone, batched, "seed {seed}");
        for key in &keys[..2] {
            let (a, b) = (format!("a:{key}"), format!("b:{key}"));
            let members: [Vec<(String, i64)>; 2] =
                [&a, &b].map(|k| conn.zrange_withscores(k, 0, -1).unwrap());
            assert_eq!(members[0], members[1], "seed {seed}: {key}");
            let px: [Option<String>; 2] = [&a, &b].map(|k| conn.get(format!("px|{k}")).unwrap());
            assert_eq!(px[0], px[1], "seed {seed}: {key}'s PEXPIRE");
        }
    }
    // The cases cover what they should: passes, releases, failures.
    assert!(passed > decided / 5, "{passed} passed of {decided}");
    assert!(released > 100, "{released} slots released");
    assert!(failed > 20, "{failed} failed of {decided}");
    assert!(fresh_ids > 20, "{fresh_ids} sent by their id alone");
    assert!(repeated > 5, "{repeated} sent as the one before");
}
