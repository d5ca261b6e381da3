//! The clickhouse-local side of an attempt, for a load: `chpart_build::local` given what the
//! load's spec says (its table, its server's version and time zone) and this build's settings.

use super::*;

/// clickhouse-local as the load's server would compute: in the server's time zone.
pub(super) fn local_for(env: &BuildEnv<'_>, spec: &LoadSpec) -> LocalCommand {
    match &spec.server_timezone {
        Some(tz) => env.local.clone().in_timezone(tz.clone()),
        None => {
            tracing::warn!(
                "load {} began before chpart recorded the server's time zone: building in this host's",
                spec.load
            );
            env.local.clone()
        }
    }
}

/// Refuses a clickhouse-local the load's server may not read parts of, or one that computes
/// in another zone than the server's.
pub(super) fn check_local(
    local: &LocalCommand,
    spec: &LoadSpec,
    id: &LocalIdentity,
) -> Result<(), BuildError> {
    Ok(chpart_build::local::check_local(
        local,
        &spec.server_version,
        spec.server_timezone.as_deref(),
        id,
    )?)
}

/// Builds the attempt's parts ([`chpart_build::local::run_clickhouse_local`]) for the load of
/// `spec`.
pub(super) fn run_clickhouse_local(
    env: &BuildEnv<'_>,
    spec: &LoadSpec,
    work: &WorkDir,
    input: Input,
    merge: bool,
    routed: Option<(&[(String, u32)], &str)>,
) -> Result<Vec<Built>, BuildError> {
    let local = local_for(env, spec);
    let target = target_columns(spec)?;
    let build = LocalBuild {
        local: &local,
        create_table_query: &spec.publish_snapshot.create_table_query,
        engine: &spec.publish_snapshot.shape.engine,
        target: &target,
        server_version: &spec.server_version,
        server_timezone: spec.server_timezone.as_deref(),
        spool_chunk_bytes: env.spool_chunk_bytes,
        merge_split_partitions: env.merge_split_partitions,
        now_unix_ms,
    };
    Ok(chpart_build::local::run_clickhouse_local(
        &build, work, input, merge, routed,
    )?)
}
