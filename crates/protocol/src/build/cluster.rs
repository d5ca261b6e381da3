//! An attempt of a load into a Distributed table: rows routed to the shards in one
//! clickhouse-local session, each shard's parts published on its host.

use super::*;

/// [`build`] of a load into a Distributed table: the rows routed to the shards inside one
/// clickhouse-local session, then each shard's parts shipped and published on its host, in
/// parallel; one manifest per shard's sub-load, printed together as the cluster manifest.
/// Every shard's staging is claimed before any work, and a failure on any shard undoes what
/// this attempt published on every shard.
pub(super) fn build_cluster(
    env: &BuildEnv<'_>,
    spec: &LoadSpec,
    cluster: &ClusterSpec,
    req: BuildRequest,
    started: Instant,
) -> Result<BuildReport, BuildError> {
    let on_shard = |shard: &ShardSpec, e: BuildError| BuildError::Shard {
        shard_num: shard.shard_num,
        host: shard.host.clone(),
        source: Box::new(e),
    };
    let route = cluster
        .routing()
        .slot_sql()
        .map_err(|e| BuildError::Unsupported {
            load: req.load.clone(),
            message: e.to_string(),
        })?;
    let mut subs = Vec::new();
    for shard in &cluster.shards {
        let sub = open_spec(env.loads, &shard.load).map_err(|e| on_shard(shard, e))?;
        let destination = destination_of(env, &sub).map_err(|e| on_shard(shard, e))?;
        let connections = connect(env, &shard.host).map_err(|e| on_shard(shard, e))?;
        subs.push((shard, sub, destination, connections));
    }
    let mut publishers = Vec::new();
    for (shard, sub, destination, connections) in &subs {
        match Publisher::claim(
            connections[0].as_ref(),
            destination,
            &sub.load,
            &req.attempt.id,
        ) {
            Ok(p) => publishers.push(p),
            Err(e) => {
                publishers.iter_mut().for_each(Publisher::undo);
                return Err(on_shard(shard, e));
            }
        }
    }
    let result = (|| {
        let work = work_dir(env, &req)?;
        let tables: Vec<(String, u32)> = cluster
            .shards
            .iter()
            .map(|s| (format!("{LOCAL_TABLE}_{}", s.shard_num), s.shard_num))
            .collect();
        let reference = &subs[0].1;
        let step = Step::start(&req.load, "build.read").attempt(&req.attempt.id);
        let built = step_built(
            step,
            run_clickhouse_local(
                env,
                reference,
                &work,
                req.input,
                req.merge,
                Some((&tables, &route)),
            ),
        )?;
        for (_, sub, _, _) in &subs {
            check_local(&local_for(env, sub), sub, &built[0].identity)?;
        }
        tracing::info!(
            "routed {} rows to {} shard(s) in {:.2}s: {}",
            built.iter().map(|b| b.source_rows).sum::<u64>(),
            built.len(),
            started.elapsed().as_secs_f64(),
            tables
                .iter()
                .zip(&built)
                .map(|((_, n), b)| format!(
                    "shard {n}: {} rows in {} part(s)",
                    rows_of(&b.parts),
                    b.parts.len()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let build_secs = started.elapsed().as_secs_f64();
        let results: Vec<Result<(Manifest, BuildTimings), BuildError>> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = publishers
                    .iter_mut()
                    .zip(built)
                    .zip(&subs)
                    .map(|((publisher, built), (shard, sub, _, connections))| {
                        let attempt = &req.attempt;
                        scope.spawn(move || {
                            let mut timings = BuildTimings {
                                build_secs,
                                started_unix_ms: unix_ms_at(started),
                                ..Default::default()
                            };
                            publish_built(
                                env,
                                sub,
                                publisher,
                                &uploaders(connections),
                                attempt,
                                built,
                                &mut timings,
                            )
                            .map(|m| (m, timings))
                            .map_err(|e| on_shard(shard, e))
                        })
                    })
                    .collect();
                handles.into_iter().map(join).collect()
            });
        let mut manifests = Vec::new();
        let mut timings = BuildTimings {
            build_secs,
            ..Default::default()
        };
        for result in results {
            let (manifest, t) = result?;
            timings.digest_secs = timings.digest_secs.max(t.digest_secs);
            timings.upload_secs = timings.upload_secs.max(t.upload_secs);
            timings.publish_secs = timings.publish_secs.max(t.publish_secs);
            timings.bytes += t.bytes;
            manifests.push(manifest);
        }
        if let Err(e) = work.close() {
            tracing::warn!("{e}");
        }
        let line = ClusterManifest {
            load: spec.load.clone(),
            attempt: req.attempt.clone(),
            shards: cluster
                .shards
                .iter()
                .map(|s| s.shard_num)
                .zip(manifests.iter().cloned())
                .collect(),
        }
        .to_json_line();
        Ok(BuildReport {
            manifests,
            line,
            timings,
        })
    })();
    if result.is_err() {
        publishers.iter_mut().for_each(Publisher::undo);
    }
    result
}
