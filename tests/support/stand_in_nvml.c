/*
 * stand_in_nvml.c: a STAND-IN for libnvidia-ml.so.1, for tests on machines without a GPU.
 * It is NOT NVIDIA's library and knows nothing about any hardware: it implements, with the
 * same C ABI, the subset of NVML that otel-ebpf's nvml receiver calls through the real
 * pynvml bindings (nvidia-ml-py 13.x), and answers with values read from a scenario file.
 * Built by tests/support/build.py:build_stand_in_nvml() as build/stand_in_nvml/libnvidia-ml.so.1
 * (soname libnvidia-ml.so.1), loaded by pynvml's own CDLL("libnvidia-ml.so.1") through
 * LD_LIBRARY_PATH or a preload of the same soname.
 *
 * Scenario: STAND_IN_NVML_SCENARIO=path, read at the first nvmlInit (re-read after the last
 * nvmlShutdown). Without it: the defaults below. One "key value..." per line, '#' comments.
 * Global keys (before any "gpu" line):
 *   count N                 GPUs (at most 8; default 2)
 *   driver VERSION          nvmlSystemGetDriverVersion (default 550.54.15)
 *   init_error NAME         nvmlInit fails with this error (DRIVER_NOT_LOADED, NO_PERMISSION...)
 *   fail FUNCTION NAME      FUNCTION returns error NAME on every GPU
 * "gpu I" starts the keys of GPU I:
 *   uuid, name, bus (pci bus id), minor; util_gpu, util_mem (%); mem_total, mem_used (bytes;
 *   free = total - used); temp (C); power_mw, power_limit_mw, energy_mj; pcie_replays; fan (%);
 *   clock_sm, clock_mem (MHz);
 *   enc, dec (%); pcie_tx_kbs, pcie_rx_kbs (KB/s); pcie_tx_bytes, pcie_rx_bytes (byte counters
 *   behind NVML_FI_DEV_PCIE_COUNT_*; absent: NOT_SUPPORTED); ecc_corrected, ecc_uncorrected;
 *   throttle, throttle_supported (bit masks, 0x.. accepted); nvlink_links N, nvlink_up_mask,
 *   nvlink_tx_kib, nvlink_rx_kib; mig 0|1; mig_instance GI CI UUID MEM_TOTAL MEM_USED;
 *   proc PID USED_BYTES (compute); gproc PID USED_BYTES (graphics);
 *   putil PID SM MEM ENC DEC (a busy process: every nvmlDeviceGetProcessUtilization call
 *   returns one new sample of it with these values); xid N (an XID event, delivered once
 *   by nvmlEventSetWait_v2, in file order); lost 1 (every query but identity fails with
 *   GPU_IS_LOST); fail FUNCTION NAME (this GPU only).
 * Error NAMEs: NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, DRIVER_NOT_LOADED, FUNCTION_NOT_FOUND,
 * GPU_IS_LOST, UNKNOWN, or a number.
 *
 * Defaults (no scenario), GPU i in {0, 1}: uuid GPU-5a1d0000-0000-4000-8000-00000000000i,
 * name "Stand-in GPU", bus 00000000:0i:00.0, minor i, util_gpu 40+i, util_mem 20+i,
 * mem_total 80 GiB, mem_used (1+i) GiB, temp 50+i, power_mw 300000+i, power_limit_mw 700000,
 * energy_mj 123456789+i, pcie_replays 0,
 * fan 30+i, clock_sm 1980, clock_mem 2619, enc 1, dec 2, pcie 1000/2000 KB/s, ecc 0/0,
 * throttle 0x1 of 0x1ff, no NVLink, MIG off, no processes, no XID.
 *
 * Struct layouts match nvml.h and pynvml's ctypes mirrors (sizes asserted below and, on the
 * Python side, by tests/unit/receivers/test_nvml_scrape.py).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, E_UNINIT = 1, E_ARG = 2, E_NOT_SUPPORTED = 3, E_NO_PERMISSION = 4, E_NOT_FOUND = 6,
    E_INSUFFICIENT_SIZE = 7, E_DRIVER_NOT_LOADED = 9, E_TIMEOUT = 10, E_FUNCTION_NOT_FOUND = 13,
    E_GPU_IS_LOST = 15, E_UNKNOWN = 999,
};
#define MAX_GPUS 8
#define MAX_ITEMS 16
#define FIELD_NVLINK_LINK_COUNT 91
#define FIELD_NVLINK_TX 138
#define FIELD_NVLINK_RX 139
#define FIELD_PCIE_TX_BYTES 197
#define FIELD_PCIE_RX_BYTES 198
#define EVENT_XID 0x8ULL

typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_info_t;
typedef struct { unsigned int pid; unsigned long long ts; unsigned int sm, mem, enc, dec; } proc_util_t;
typedef struct { void *device; unsigned long long type, data; unsigned int gi, ci; } event_data_t;
typedef struct {
    unsigned int field_id, scope_id;
    long long timestamp, latency_us;
    int value_type, ret;
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; } value;
} field_value_t;
typedef struct {
    char bus_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} pci_info_t;
typedef struct { unsigned long long total, free, used; } memory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } memory_v2_t;
typedef struct { unsigned int gpu, memory; } utilization_t;
_Static_assert(sizeof(proc_info_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(proc_util_t) == 32, "nvmlProcessUtilizationSample_t");
_Static_assert(sizeof(event_data_t) == 32, "nvmlEventData_t");
_Static_assert(sizeof(field_value_t) == 40, "nvmlFieldValue_t");
_Static_assert(sizeof(pci_info_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(memory_v2_t) == 40, "nvmlMemory_v2_t");

enum { KIND_GPU = 0x6770, KIND_MIG = 0x6d69 };
struct gpu;
struct mig { int kind; struct gpu *parent; unsigned int gi, ci; char uuid[96];
             unsigned long long total, used; };
struct fail { char fn[64]; int rc; };
struct gpu {
    int kind;
    char uuid[96], name[96], bus[32];
    unsigned int minor, util_gpu, util_mem, temp, power_mw, power_limit_mw, fan, clock_sm, clock_mem,
        enc, dec, pcie_tx_kbs, pcie_rx_kbs, nvlink_links, nvlink_up_mask, mig_mode, lost, pcie_replays;
    unsigned long long mem_total, mem_used, ecc_corrected, ecc_uncorrected, throttle, throttle_supported,
        nvlink_tx_kib, nvlink_rx_kib, pcie_tx_bytes, pcie_rx_bytes, energy_mj;
    int has_pcie_counters;
    struct mig migs[MAX_ITEMS]; unsigned int n_migs;
    proc_info_t procs[MAX_ITEMS]; unsigned int n_procs;
    proc_info_t gprocs[MAX_ITEMS]; unsigned int n_gprocs;
    proc_util_t putil[MAX_ITEMS]; unsigned int n_putil;
    unsigned int xids[MAX_ITEMS]; unsigned int n_xids, next_xid;
    struct fail fails[MAX_ITEMS]; unsigned int n_fails;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static int init_error;
static char driver[80];
static unsigned int n_gpus;
static struct gpu gpus[MAX_GPUS];
static struct fail global_fails[MAX_ITEMS];
static unsigned int n_global_fails;

static int error_code(const char *name) {
    static const struct { const char *name; int rc; } names[] = {
        {"NOT_SUPPORTED", E_NOT_SUPPORTED}, {"NO_PERMISSION", E_NO_PERMISSION}, {"NOT_FOUND", E_NOT_FOUND},
        {"DRIVER_NOT_LOADED", E_DRIVER_NOT_LOADED}, {"FUNCTION_NOT_FOUND", E_FUNCTION_NOT_FOUND},
        {"GPU_IS_LOST", E_GPU_IS_LOST}, {"UNKNOWN", E_UNKNOWN},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i].name) == 0) return names[i].rc;
    return atoi(name) ? atoi(name) : E_UNKNOWN;
}

static void defaults(void) {
    memset(gpus, 0, sizeof(gpus));
    n_gpus = 2;
    init_error = OK;
    n_global_fails = 0;
    snprintf(driver, sizeof(driver), "550.54.15");
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        struct gpu *g = &gpus[i];
        g->kind = KIND_GPU;
        snprintf(g->uuid, sizeof(g->uuid), "GPU-5a1d0000-0000-4000-8000-%012u", i);
        snprintf(g->name, sizeof(g->name), "Stand-in GPU");
        snprintf(g->bus, sizeof(g->bus), "00000000:%02X:00.0", i);
        g->minor = i; g->util_gpu = 40 + i; g->util_mem = 20 + i;
        g->mem_total = 80ULL << 30; g->mem_used = (1ULL + i) << 30;
        g->temp = 50 + i; g->power_mw = 300000 + i; g->power_limit_mw = 700000; g->fan = 30 + i;
        g->clock_sm = 1980; g->clock_mem = 2619; g->enc = 1; g->dec = 2;
        g->pcie_tx_kbs = 1000; g->pcie_rx_kbs = 2000;
        g->throttle = 0x1; g->throttle_supported = 0x1ff;
        g->energy_mj = 123456789ULL + i; g->pcie_replays = 0;
    }
}

static unsigned long long num(const char *s) { return strtoull(s, NULL, 0); }

static void add_fail(struct fail *fails, unsigned int *n, const char *fn, const char *err) {
    if (*n >= MAX_ITEMS) return;
    snprintf(fails[*n].fn, sizeof(fails[*n].fn), "%s", fn);
    fails[(*n)++].rc = error_code(err);
}

static void gpu_key(struct gpu *g, const char *key, char *a, const char *rest, char **save) {
    char *b = strtok_r(NULL, " \t", save), *c = strtok_r(NULL, " \t", save);
    char *d = strtok_r(NULL, " \t", save), *e = strtok_r(NULL, " \t", save);
#define U(k) else if (strcmp(key, #k) == 0) g->k = (unsigned int)num(a)
#define L(k) else if (strcmp(key, #k) == 0) g->k = num(a)
    if (strcmp(key, "uuid") == 0) snprintf(g->uuid, sizeof(g->uuid), "%s", a);
    else if (strcmp(key, "name") == 0) snprintf(g->name, sizeof(g->name), "%s", rest);  /* has spaces */
    else if (strcmp(key, "bus") == 0) snprintf(g->bus, sizeof(g->bus), "%s", a);
    U(minor); U(util_gpu); U(util_mem); U(temp); U(power_mw); U(power_limit_mw); U(fan); U(clock_sm);
    U(clock_mem); U(enc); U(dec); U(pcie_tx_kbs); U(pcie_rx_kbs); U(nvlink_links); U(nvlink_up_mask);
    U(lost); U(pcie_replays);
    L(mem_total); L(mem_used); L(ecc_corrected); L(ecc_uncorrected); L(throttle); L(throttle_supported);
    L(nvlink_tx_kib); L(nvlink_rx_kib); L(energy_mj);
    else if (strcmp(key, "mig") == 0) g->mig_mode = (unsigned int)num(a);
    else if (strcmp(key, "pcie_tx_bytes") == 0) { g->pcie_tx_bytes = num(a); g->has_pcie_counters = 1; }
    else if (strcmp(key, "pcie_rx_bytes") == 0) { g->pcie_rx_bytes = num(a); g->has_pcie_counters = 1; }
    else if (strcmp(key, "mig_instance") == 0 && e && g->n_migs < MAX_ITEMS) {
        struct mig *m = &g->migs[g->n_migs++];
        m->kind = KIND_MIG; m->parent = g; m->gi = (unsigned int)num(a); m->ci = (unsigned int)num(b);
        snprintf(m->uuid, sizeof(m->uuid), "%s", c); m->total = num(d); m->used = num(e);
    } else if ((strcmp(key, "proc") == 0 || strcmp(key, "gproc") == 0) && b) {
        int graphics = key[0] == 'g';
        proc_info_t *list = graphics ? g->gprocs : g->procs;
        unsigned int *n = graphics ? &g->n_gprocs : &g->n_procs;
        if (*n < MAX_ITEMS) { list[*n].pid = (unsigned int)num(a); list[*n].used = num(b);
                              list[*n].gi = list[*n].ci = 0xffffffffu; (*n)++; }
    } else if (strcmp(key, "putil") == 0 && e && g->n_putil < MAX_ITEMS) {
        proc_util_t *p = &g->putil[g->n_putil++];
        p->pid = (unsigned int)num(a); p->sm = (unsigned int)num(b); p->mem = (unsigned int)num(c);
        p->enc = (unsigned int)num(d); p->dec = (unsigned int)num(e);
    } else if (strcmp(key, "xid") == 0 && g->n_xids < MAX_ITEMS) g->xids[g->n_xids++] = (unsigned int)num(a);
    else if (strcmp(key, "fail") == 0 && b) add_fail(g->fails, &g->n_fails, a, b);
#undef U
#undef L
}

static void load_scenario(void) {
    defaults();
    const char *path = getenv("STAND_IN_NVML_SCENARIO");
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[512], raw[512];
    struct gpu *g = NULL;
    while (fgets(line, sizeof(line), f)) {
        char *hash = strchr(line, '#'), *save = NULL;
        if (hash) *hash = 0;
        line[strcspn(line, "\r\n")] = 0;
        memcpy(raw, line, sizeof(raw));
        char *key = strtok_r(line, " \t", &save), *v = key ? strtok_r(NULL, " \t", &save) : NULL;
        if (!key || !v) continue;
        const char *rest = raw + (v - line);  /* the whole value, spaces included */
        if (strcmp(key, "gpu") == 0) { unsigned int i = (unsigned int)num(v);
                                       g = i < MAX_GPUS ? &gpus[i] : NULL; continue; }
        if (g) { gpu_key(g, key, v, rest, &save); continue; }
        if (strcmp(key, "count") == 0) n_gpus = (unsigned int)num(v) > MAX_GPUS ? MAX_GPUS : (unsigned int)num(v);
        else if (strcmp(key, "driver") == 0) snprintf(driver, sizeof(driver), "%s", v);
        else if (strcmp(key, "init_error") == 0) init_error = error_code(v);
        else if (strcmp(key, "fail") == 0) { char *err = strtok_r(NULL, " \t", &save);
                                             if (err) add_fail(global_fails, &n_global_fails, v, err); }
    }
    fclose(f);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    if (refcount == 0) load_scenario();
    int rc = init_error;
    if (rc == OK) refcount++;
    pthread_mutex_unlock(&lock);
    return rc;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    int rc = refcount > 0 ? OK : E_UNINIT;
    if (refcount > 0) refcount--;
    pthread_mutex_unlock(&lock);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_ARG: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_NO_PERMISSION: return "Insufficient Permissions";
    case E_NOT_FOUND: return "Not Found";
    case E_INSUFFICIENT_SIZE: return "Insufficient Size";
    case E_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case E_TIMEOUT: return "Timeout";
    case E_FUNCTION_NOT_FOUND: return "Function Not Found";
    case E_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

/* ---- checks ------------------------------------------------------------------------------- */
static int failing(const struct fail *fails, unsigned int n, const char *fn) {
    for (unsigned int i = 0; i < n; i++)
        if (strcmp(fails[i].fn, fn) == 0) return fails[i].rc;
    return OK;
}

/* The GPU behind a handle (a MIG handle answers for its parent's failures), or NULL. */
static struct gpu *gpu_of(void *dev) {
    if (!dev) return NULL;
    if (*(int *)dev == KIND_MIG) return ((struct mig *)dev)->parent;
    return *(int *)dev == KIND_GPU ? (struct gpu *)dev : NULL;
}

/* OK, or the error this call returns: not initialized, bad handle, a lost GPU (identity calls
 * still answer, as the driver keeps them), or a scenario "fail" line. */
static int check(void *dev, const char *fn, int identity) {
    if (refcount <= 0) return E_UNINIT;
    struct gpu *g = gpu_of(dev);
    if (!g) return E_ARG;
    if (g->lost && !identity) return E_GPU_IS_LOST;
    int rc = failing(g->fails, g->n_fails, fn);
    return rc ? rc : failing(global_fails, n_global_fails, fn);
}
#define CHECK(dev) do { int rc_ = check((dev), __func__, 0); if (rc_) return rc_; } while (0)
#define CHECK_ID(dev) do { int rc_ = check((dev), __func__, 1); if (rc_) return rc_; } while (0)
#define G(dev) gpu_of(dev)

/* ---- system and identity ------------------------------------------------------------------ */
nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned int len) {
    if (refcount <= 0) return E_UNINIT;
    int rc = failing(global_fails, n_global_fails, __func__);
    if (rc) return rc;
    snprintf(out, len, "%s", driver);
    return OK;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (refcount <= 0) return E_UNINIT;
    *count = n_gpus;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **dev) {
    if (refcount <= 0) return E_UNINIT;
    if (index >= n_gpus) return E_ARG;
    *dev = &gpus[index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(void *dev, char *out, unsigned int len) {
    CHECK_ID(dev);
    snprintf(out, len, "%s", *(int *)dev == KIND_MIG ? ((struct mig *)dev)->uuid : G(dev)->uuid);
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(void *dev, char *out, unsigned int len) {
    CHECK_ID(dev); snprintf(out, len, "%s", G(dev)->name); return OK;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(void *dev, unsigned int *minor) {
    CHECK_ID(dev); *minor = G(dev)->minor; return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *dev, pci_info_t *pci) {
    CHECK_ID(dev);
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->bus_id, sizeof(pci->bus_id), "%s", G(dev)->bus);
    snprintf(pci->bus_legacy, sizeof(pci->bus_legacy), "%.15s", G(dev)->bus);
    pci->bus = G(dev)->minor;
    return OK;
}

/* ---- readings ----------------------------------------------------------------------------- */
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *dev, utilization_t *u) {
    CHECK(dev); u->gpu = G(dev)->util_gpu; u->memory = G(dev)->util_mem; return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *dev, memory_t *m) {
    CHECK(dev);
    if (*(int *)dev == KIND_MIG) { struct mig *x = dev; m->total = x->total; m->used = x->used; }
    else { m->total = G(dev)->mem_total; m->used = G(dev)->mem_used; }
    m->free = m->total - m->used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *dev, memory_v2_t *m) {
    memory_t v1;
    int rc = nvmlDeviceGetMemoryInfo(dev, &v1);
    if (rc) return rc;
    m->total = v1.total; m->reserved = 0; m->free = v1.free; m->used = v1.used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(void *dev, int sensor, unsigned int *t) {
    CHECK(dev); if (sensor != 0) return E_ARG; *t = G(dev)->temp; return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(void *dev, unsigned int *mw) { CHECK(dev); *mw = G(dev)->power_mw; return OK; }
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *dev, unsigned long long *mj) {
    CHECK(dev); *mj = G(dev)->energy_mj; return OK;
}
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(void *dev, unsigned int *n) { CHECK(dev); *n = G(dev)->pcie_replays; return OK; }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *dev, unsigned int *mw) {
    CHECK(dev); *mw = G(dev)->power_limit_mw; return OK;
}
nvmlReturn_t nvmlDeviceGetFanSpeed(void *dev, unsigned int *pct) { CHECK(dev); *pct = G(dev)->fan; return OK; }
nvmlReturn_t nvmlDeviceGetClockInfo(void *dev, int type, unsigned int *mhz) {
    CHECK(dev);
    if (type == 1) *mhz = G(dev)->clock_sm;       /* NVML_CLOCK_SM */
    else if (type == 2) *mhz = G(dev)->clock_mem; /* NVML_CLOCK_MEM */
    else return E_NOT_SUPPORTED;
    return OK;
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(void *dev, unsigned int *u, unsigned int *period_us) {
    CHECK(dev); *u = G(dev)->enc; *period_us = 167000; return OK;
}
nvmlReturn_t nvmlDeviceGetDecoderUtilization(void *dev, unsigned int *u, unsigned int *period_us) {
    CHECK(dev); *u = G(dev)->dec; *period_us = 167000; return OK;
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(void *dev, int counter, unsigned int *kbs) {
    CHECK(dev);
    if (counter == 0) *kbs = G(dev)->pcie_tx_kbs;      /* NVML_PCIE_UTIL_TX_BYTES */
    else if (counter == 1) *kbs = G(dev)->pcie_rx_kbs; /* NVML_PCIE_UTIL_RX_BYTES */
    else return E_ARG;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *dev, int error_type, int counter_type, unsigned long long *n) {
    CHECK(dev);
    (void)counter_type;
    *n = error_type == 0 ? G(dev)->ecc_corrected : G(dev)->ecc_uncorrected;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *dev, unsigned long long *mask) {
    CHECK(dev); *mask = G(dev)->throttle; return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *dev, unsigned long long *mask) {
    CHECK(dev); *mask = G(dev)->throttle; return OK;
}
nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(void *dev, unsigned long long *mask) {
    CHECK(dev); *mask = G(dev)->throttle_supported; return OK;
}
nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(void *dev, unsigned long long *mask) {
    CHECK(dev); *mask = G(dev)->throttle_supported; return OK;
}

/* ---- NVLink and field values -------------------------------------------------------------- */
static void field(struct gpu *g, field_value_t *v) {
    v->ret = OK; v->value_type = 3; /* NVML_VALUE_TYPE_UNSIGNED_LONG_LONG */
    v->timestamp = (long long)time(NULL) * 1000000LL; v->latency_us = 0;
    switch (v->field_id) {
    case FIELD_NVLINK_LINK_COUNT:
        if (!g->nvlink_links) { v->ret = E_NOT_SUPPORTED; break; }
        v->value_type = 1; v->value.ui = g->nvlink_links; break;
    case FIELD_NVLINK_TX: if (!g->nvlink_links) v->ret = E_NOT_SUPPORTED; else v->value.ull = g->nvlink_tx_kib; break;
    case FIELD_NVLINK_RX: if (!g->nvlink_links) v->ret = E_NOT_SUPPORTED; else v->value.ull = g->nvlink_rx_kib; break;
    case FIELD_PCIE_TX_BYTES: if (!g->has_pcie_counters) v->ret = E_NOT_SUPPORTED; else v->value.ull = g->pcie_tx_bytes; break;
    case FIELD_PCIE_RX_BYTES: if (!g->has_pcie_counters) v->ret = E_NOT_SUPPORTED; else v->value.ull = g->pcie_rx_bytes; break;
    default: v->ret = E_NOT_SUPPORTED;
    }
}
nvmlReturn_t nvmlDeviceGetFieldValues(void *dev, int count, field_value_t *values) {
    CHECK(dev);
    for (int i = 0; i < count; i++) field(G(dev), &values[i]);
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(void *dev, unsigned int link, unsigned int *active) {
    CHECK(dev);
    if (link >= G(dev)->nvlink_links) return E_ARG;
    *active = (G(dev)->nvlink_up_mask >> link) & 1u;
    return OK;
}

/* ---- MIG ---------------------------------------------------------------------------------- */
nvmlReturn_t nvmlDeviceGetMigMode(void *dev, unsigned int *current, unsigned int *pending) {
    CHECK(dev); *current = *pending = G(dev)->mig_mode; return OK;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *dev, unsigned int *count) {
    CHECK(dev); *count = G(dev)->mig_mode ? 7 : 0; return OK;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *dev, unsigned int index, void **mig) {
    CHECK(dev);
    if (!G(dev)->mig_mode) return E_NOT_SUPPORTED;
    if (index >= G(dev)->n_migs) return E_NOT_FOUND;
    *mig = &G(dev)->migs[index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *dev, unsigned int *id) {
    CHECK(dev); if (*(int *)dev != KIND_MIG) return E_ARG; *id = ((struct mig *)dev)->gi; return OK;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *dev, unsigned int *id) {
    CHECK(dev); if (*(int *)dev != KIND_MIG) return E_ARG; *id = ((struct mig *)dev)->ci; return OK;
}

/* ---- processes ---------------------------------------------------------------------------- */
static nvmlReturn_t copy_procs(const proc_info_t *list, unsigned int n, unsigned int *count, proc_info_t *out) {
    if (n == 0) { *count = 0; return OK; }
    if (!out || *count < n) { *count = n; return E_INSUFFICIENT_SIZE; }
    memcpy(out, list, n * sizeof(*list));
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned int *count, proc_info_t *out) {
    CHECK(dev); return copy_procs(G(dev)->procs, G(dev)->n_procs, count, out);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *dev, unsigned int *count, proc_info_t *out) {
    CHECK(dev); return copy_procs(G(dev)->procs, G(dev)->n_procs, count, out);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(void *dev, unsigned int *count, proc_info_t *out) {
    CHECK(dev); return copy_procs(G(dev)->gprocs, G(dev)->n_gprocs, count, out);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(void *dev, unsigned int *count, proc_info_t *out) {
    CHECK(dev); return copy_procs(G(dev)->gprocs, G(dev)->n_gprocs, count, out);
}
/* Samples newer than last_seen (microseconds); NOT_FOUND when there are none, as NVML does.
 * Every "putil" process is busy: each call finds one new sample of it, stamped now. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(void *dev, proc_util_t *out, unsigned int *count,
                                             unsigned long long last_seen) {
    CHECK(dev);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long now_us = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000;
    if (now_us <= last_seen) now_us = last_seen + 1;
    for (unsigned int i = 0; i < G(dev)->n_putil; i++) G(dev)->putil[i].ts = now_us;
    unsigned int n = 0;
    for (unsigned int i = 0; i < G(dev)->n_putil; i++) n += G(dev)->putil[i].ts > last_seen;
    if (n == 0) { *count = 0; return E_NOT_FOUND; }
    if (!out || *count < n) { *count = n; return E_INSUFFICIENT_SIZE; }
    n = 0;
    for (unsigned int i = 0; i < G(dev)->n_putil; i++)
        if (G(dev)->putil[i].ts > last_seen) out[n++] = G(dev)->putil[i];
    *count = n;
    return OK;
}

/* ---- events ------------------------------------------------------------------------------- */
struct event_set { struct gpu *gpus[MAX_GPUS]; unsigned int n; };

nvmlReturn_t nvmlEventSetCreate(struct event_set **set) {
    if (refcount <= 0) return E_UNINIT;
    int rc = failing(global_fails, n_global_fails, __func__);
    if (rc) return rc;
    *set = calloc(1, sizeof(**set));
    return *set ? OK : E_UNKNOWN;
}
nvmlReturn_t nvmlDeviceRegisterEvents(void *dev, unsigned long long types, struct event_set *set) {
    CHECK(dev);
    if (!set) return E_ARG;
    if (!(types & EVENT_XID)) return E_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    if (set->n < MAX_GPUS) set->gpus[set->n++] = G(dev);
    pthread_mutex_unlock(&lock);
    return OK;
}
/* The next pending XID of a registered GPU, at once; otherwise sleep `timeout_ms` and TIMEOUT. */
nvmlReturn_t nvmlEventSetWait_v2(struct event_set *set, event_data_t *data, unsigned int timeout_ms) {
    if (refcount <= 0) return E_UNINIT;
    if (!set) return E_ARG;
    pthread_mutex_lock(&lock);
    for (unsigned int i = 0; i < set->n; i++) {
        struct gpu *g = set->gpus[i];
        if (g->next_xid < g->n_xids) {
            memset(data, 0, sizeof(*data));
            data->device = g; data->type = EVENT_XID; data->data = g->xids[g->next_xid++];
            data->gi = data->ci = 0xffffffffu;
            pthread_mutex_unlock(&lock);
            return OK;
        }
    }
    pthread_mutex_unlock(&lock);
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    return E_TIMEOUT;
}
nvmlReturn_t nvmlEventSetFree(struct event_set *set) { free(set); return OK; }
