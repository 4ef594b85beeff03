"""``gpuobs exporter``: serve the simulated fleet (or this machine's GPUs through NVML)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuobs.cli.common import (
    add_fleet_hardware_flags,
    PORT,
    env,
    fail,
    named,
    finite,
    int_range,
    pos_float,
    run_dir_default,
)


def cmd_exporter(args: argparse.Namespace) -> int:
    from gpuobs.exporter.simfleet import (
        SimFleet,
        SimFleetSpec,
        load_k8s_map,
        load_or_create_token,
    )
    from gpuobs.exporter.sim import profiles
    from gpuobs.exporter.sim.mig import parse_mig_spec
    from gpuobs.core.errors import InputError
    from gpuobs.exporter.sim.gpu import parse_gpu_models
    from gpuobs.flags.flagd import FlagFileError
    from gpuobs.reference.drivers import DriverCatalogueError
    from gpuobs.reference.drivers import load as load_drivers
    from gpuobs.reference.releases import CatalogueError

    for flag, value, allowed in (("--exporter-profile (GPUOBS_EXPORTER_PROFILE)", args.exporter_profile, profiles.PROFILES),
                                 ("--host-label-mode (GPUOBS_HOST_LABEL_MODE)", args.host_label_mode,
                                  profiles.HOST_LABEL_MODES)):
        if value not in allowed:
            return fail(f"{flag} must be one of {', '.join(allowed)}; got {value!r}")
    if args.collect_interval < 0:
        return fail(f"--collect-interval must be >= 0 seconds; got {args.collect_interval:g}")
    mode = args.hostname_label or args.host_label_mode  # --hostname-label: the older spelling of two modes
    if args.source == "nvml":
        from gpuobs.exporter.nvml.serve import main_nvml

        return main_nvml(args.host, args.base_port, "hostname" if mode == "hostname" else "Hostname")
    for flag, base in (("--base-port", args.base_port), ("--engine-base-port", args.engine_base_port)):
        if base + args.nodes - 1 > 65535:
            return fail(f"{flag} {base} + --nodes {args.nodes} runs past port 65535")
    if args.training_nodes > args.nodes:
        return fail(f"--training-nodes {args.training_nodes} exceeds --nodes {args.nodes}")
    try:
        profiles.load(args.exporter_profile, args.clock_events_name)
    except (OSError, ValueError) as exc:
        return fail(f"--exporter-profile {args.exporter_profile}: {exc}")
    try:
        mig = parse_mig_spec(args.mig_profile, args.gpus) if args.mig_profile else None
        k8s = load_k8s_map(Path(args.k8s_map)) if args.k8s_map else None
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    try:
        from gpuobs.exporter.sim.behaviour import load as load_releases

        load_releases(Path(args.releases) if args.releases else None)
    except CatalogueError as exc:
        return fail(f"--releases: {exc}")
    try:
        load_drivers(Path(args.drivers) if args.drivers else None)
    except DriverCatalogueError as exc:
        return fail(f"--drivers (GPUOBS_DRIVERS): {exc}")
    try:
        parse_gpu_models(args.gpu_models or "", args.nodes - args.training_nodes,
                         named("--gpu-models", args.gpu_models, "GPU_MODELS"))
    except InputError as exc:
        return fail(str(exc))
    try:
        token = load_or_create_token(args.token, Path(args.token_file))
    except (OSError, ValueError) as exc:
        return fail(f"admin token: {exc}")
    cfg = SimFleetSpec(nodes=args.nodes, gpus=args.gpus, base_port=args.base_port, seed=args.seed, host=args.host,
                      driver_version=args.driver_version, host_label_mode=mode,
                      exporter_profile=args.exporter_profile, clock_events_name=args.clock_events_name,
                      collect_interval_s=args.collect_interval,
                      targets_file=Path(args.targets_file) if args.targets_file else None,
                      xid_window_ms=args.xid_window_ms, tick_s=args.tick_s, engine_base_port=args.engine_base_port,
                      training_nodes=args.training_nodes, node_offset=args.node_offset, rate_rps=args.rate,
                      mig=mig, k8s=k8s, releases_file=Path(args.releases) if args.releases else None,
                      flags_file=Path(args.flags) if args.flags else None, gpu_models=args.gpu_models or "",
                      drivers_file=Path(args.drivers) if args.drivers else None)
    try:
        fleet = SimFleet(cfg, token)
    except FlagFileError as exc:
        return fail(f"--flags: {exc}")
    except (CatalogueError, KeyError) as exc:
        return fail(f"--releases: {exc}")
    except OSError as exc:
        return fail(f"cannot listen on {args.host}:{args.base_port}..{args.base_port + args.nodes - 1}: {exc}")
    fleet.run_forever()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``exporter`` group to ``sub``."""
    e = sub.add_parser("exporter", help="serve simulated GPU nodes (DCGM metrics + fault admin API)")
    e.add_argument("--nodes", type=int_range(1, 4096), default=4, help="number of nodes (default 4)")
    e.add_argument("--gpus", type=int_range(1, 16), default=8, help="GPUs per node (default 8)")
    e.add_argument("--base-port", type=PORT, default=9400, help="node i listens on base-port + i (default 9400)")
    e.add_argument("--seed", type=int, default=1, help="RNG seed: same seed, same fleet (default 1)")
    e.add_argument("--host", default=env("HOST", "127.0.0.1"), help="listen address (default 127.0.0.1)")
    e.add_argument("--token", default=env("ADMIN_TOKEN"), help="admin bearer token (env GPUOBS_ADMIN_TOKEN)")
    e.add_argument("--token-file", default=str(Path(run_dir_default()) / "admin-token"),
                   help="read the token here, or write a generated one here (default .run/admin-token)")
    e.add_argument("--driver-version", default="550.54.15", help="DCGM_FI_DRIVER_VERSION label (default 550.54.15)")
    e.add_argument("--exporter-profile", default=env("EXPORTER_PROFILE", "stock"),
                   help="what the DCGM page serves: stock (dcgm-exporter 4.x default-counters.csv, the default), "
                        "helm (the Helm chart's ConfigMap: no driver label, no FB_RESERVED), recommended "
                        "(deploy/dcgm-exporter/recommended.csv + gpuobs extras); env GPUOBS_EXPORTER_PROFILE")
    e.add_argument("--host-label-mode", default=env("HOST_LABEL_MODE", "Hostname"),
                   help="the DCGM page's host label: Hostname (node name; released dcgm-exporter), hostname "
                        "(master after PR #655), localhost (4.0-4.5.3 with -r), pod (the exporter pod's name, "
                        "new on each restart), none (-n); env GPUOBS_HOST_LABEL_MODE")
    e.add_argument("--hostname-label", default=None, choices=["Hostname", "hostname"],
                   help="older spelling of --host-label-mode Hostname|hostname")
    e.add_argument("--clock-events-name", default="canonical", choices=["canonical", "legacy"],
                   help="name of field 112 where the profile serves it: DCGM_FI_DEV_CLOCKS_EVENT_REASONS "
                        "(canonical) or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (legacy counters files)")
    e.add_argument("--collect-interval", type=finite(float), default=0.0, metavar="SECONDS",
                   help="DCGM field update interval: values repeat across scrapes in between (DCGM's "
                        "default is 30); 0 samples on every scrape (default)")
    e.add_argument("--targets-file", default=None,
                   help="ServiceMonitor-shaped file_sd file of the DCGM targets: its pod labels follow "
                        "exporter restarts (set by `gpuobs stack up --scrape-mode servicemonitor`)")
    e.add_argument("--xid-window-ms", type=int_range(1000, 86_400_000), default=300_000,
                   help="DCGM_EXP_XID_ERRORS_COUNT window, ms (dcgm-exporter default 300000)")
    e.add_argument("--tick-s", type=pos_float, default=1.0, help="simulation tick, seconds (default 1)")
    e.add_argument("--source", choices=["sim", "nvml"], default="sim",
                   help="sim: simulated fleet (default); nvml: this machine's real GPUs through NVML")
    e.add_argument("--engine-base-port", type=PORT, default=8000,
                   help="serving node i exposes its vLLM-style engine page on engine-base-port + i (default 8000)")
    e.add_argument("--training-nodes", type=int_range(0, 4096), default=0,
                   help="the last N nodes run the training role instead of a serving engine")
    e.add_argument("--node-offset", type=int_range(0, 4095), default=0,
                   help="index of the first node (one process per node in compose: node K uses --node-offset K)")
    e.add_argument("--rate", type=pos_float, default=4.0, help="mean request rate per serving node, req/s")
    e.add_argument("--mig-profile", default=None,
                   help="MIG: a profile for every GPU (1g.10gb) or per GPU (0=1g.10gb,3=3g.40gb)")
    e.add_argument("--k8s-map", default=None, help="YAML/JSON file: hostname -> GPU index -> {pod, namespace, container}")
    e.add_argument("--releases", default=env("RELEASES"), help="release catalogue YAML (default: packaged)")
    e.add_argument("--flags", default=env("FLAGS_FILE"), metavar="FILE",
                   help="flagd-format feature-flag file the engines evaluate through OpenFeature (env "
                        "GPUOBS_FLAGS_FILE; default: none, every flag off)")
    add_fleet_hardware_flags(e)
    e.set_defaults(func=cmd_exporter)
