-- GPU telemetry, energy and machine state (issue 15).  The runs gain the GPU and energy
-- monitor's aggregates (runner/executors/energy.py: NVML for the cell's GPUs, RAPL for the CPU
-- packages; NULL where unmeasured, never 0) and whether the run started on a busy machine
-- (result.json host.state, runner/sweep/machine.py); gpu_samples keeps NVML's samples raw, one
-- row per GPU per sample, as monitor_samples keeps the CPU's.
ALTER TABLE runs ADD COLUMN gpu_util_avg DOUBLE;             -- percent, mean over samples and GPUs
ALTER TABLE runs ADD COLUMN gpu_mem_used_peak_bytes BIGINT;  -- NVML's memory used, the peak of any GPU
ALTER TABLE runs ADD COLUMN gpu_power_avg_w DOUBLE;          -- watts, the cell's GPUs summed
ALTER TABLE runs ADD COLUMN gpu_energy_j DOUBLE;             -- joules over the run, the cell's GPUs summed
ALTER TABLE runs ADD COLUMN gpu_throttled BOOLEAN;           -- a throttling clock-event reason was seen
ALTER TABLE runs ADD COLUMN cpu_energy_j DOUBLE;             -- joules of the host's CPU packages (RAPL)
ALTER TABLE runs ADD COLUMN busy_start BOOLEAN;              -- other processes busy on the cell's CPUs at start

CREATE TABLE gpu_samples (
    run_id          VARCHAR NOT NULL,
    t               DOUBLE NOT NULL,     -- seconds since the monitor started
    gpu             INTEGER NOT NULL,    -- the GPU's ordinal in the cell (gpu.jsonl's header maps it to a UUID)
    util            DOUBLE,              -- percent of time a kernel ran
    mem_util        DOUBLE,              -- percent of time memory was read or written
    mem_used_bytes  BIGINT,
    power_w         DOUBLE,
    energy_j        DOUBLE,              -- NVML's counter since the driver loaded
    sm_clock_mhz    INTEGER,
    mem_clock_mhz   INTEGER,
    temp_c          DOUBLE,
    throttle        BIGINT               -- NVML's clock-event reason bits
);
