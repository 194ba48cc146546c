// aoti-farm's native hit path: a boxed C++ kernel per served op that serves calls whose
// exact metadata it has already seen, without entering Python.
//
// The serving decisions stay in Python (aoti_farm.runtime.hook): signature encoding, the
// cache index, verification before a kernel is loaded, the miss queue.  This file only
// remembers, per op, what Python decided for a given *fast key* and replays it:
//
//   fast key -> kernel   run the kernel (a container of its own per concurrent thread, see Kernel)
//   fast key -> eager    call the original kernel (a queued miss or a failed signature)
//   unknown              ask Python: decide(slot, values) -> kernel id | EAGER_* code
//
// The fast key is every piece of call metadata the dispatcher hands us: per argument its
// IValue tag and, for a tensor, dtype, device, sizes and strides; for a scalar its exact
// value (a double's bits: -0.0 is not 0.0).  It is therefore at least as fine as aoti-farm's
// signature (which is built from the same arguments), so two calls with one fast key always
// have one signature.  It starts with the conditions a decision depends on beyond the
// arguments (key_conditions: the default dtype, the TF32/cuBLAS/cuDNN/oneDNN flags,
// deterministic mode, this thread's intra-op thread count), so a decision made under one
// setting is never replayed under another: a call under new values is decided again.  Calls
// with anything the key does not capture (a wrapped Python number, a conj/neg view, a
// non-strided or symbolic tensor, grad mode with a tensor that requires grad, an argument
// of any other type) never use a remembered decision.
//
// Nothing here raises into the caller except eager's own errors: a failing runner or a
// failing Python callback becomes eager's result and a counter.  A runner that fails where
// eager fails too (the caller's error: a division by zero, an index out of range) is not
// reported: eager's error propagates and the kernel stays.
//
// Making room for the compiler: while the hook's background compile runs, Python sets a
// thread limit (cores - compiles) and every thread that enters one of these kernels lowers
// its own intra-op thread count to it (OpenMP's count is per thread), then puts back what
// it had once the limit is lifted.  A thread looks at the limit's generation on every call
// (one relaxed load); the rest happens only when it changed.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/inductor/aoti_runtime/interface.h>
#include <torch/csrc/inductor/aoti_torch/tensor_converter.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_dtypes.h>
#include <torch/csrc/utils/tensor_layouts.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>
#include <torch/python.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int64_t EAGER_MISS = -1;     // remembered: a miss (queued); counted as a miss
constexpr int64_t EAGER_FAILED = -2;   // remembered: a signature with a failure record
constexpr int64_t EAGER_ONCE = -3;     // not remembered: Python counted this call itself
// remembered: a call aoti-farm can never serve (signature.Ineligible); reason id r is
// coded as EAGER_INELIGIBLE_BASE - r (r < INELIGIBLE_REASONS), counted per reason
constexpr int64_t EAGER_INELIGIBLE_BASE = -1000;
constexpr int64_t INELIGIBLE_REASONS = 256;
constexpr int64_t EAGER_GATED = -4;    // remembered: a cached kernel the speed gate declined (runtime/gate.py)
// Most remembered calls per op; a full op forgets everything it remembered (dynamic
// shapes must not grow memory without bound) and learns again through Python.
constexpr size_t KNOWN_LIMIT = 16384;

thread_local bool t_inside = false;    // this thread is inside one of our kernels
// The speed gate's on-host trial (runtime/trial.py): this thread's calls of a served op
// run kernel t_force_id of the registration whose state is t_force_state, whatever their
// key, so a kernel and eager are timed through the same dispatcher path.  Never
// remembered, never counted as hits.
thread_local const void* t_force_state = nullptr;
thread_local int64_t t_force_id = -1;

struct InsideGuard {
  bool prev;
  InsideGuard() : prev(t_inside) { t_inside = true; }
  ~InsideGuard() { t_inside = prev; }
};

// --- making room for the compiler (process-wide, shared by every FastPath) --------------------

std::atomic<int> g_limit{0};              // > 0: threads use at most this many intra-op threads
std::atomic<uint64_t> g_gen{1};           // bumped by every set_thread_limit()
std::atomic<uint64_t> g_lowered{0}, g_restored{0}, g_thread_errors{0};
thread_local uint64_t t_gen = 0;          // the generation this thread last followed
std::mutex g_ymu;
std::unordered_map<long, std::pair<int, int>> g_saved;  // thread id -> (its count, the count set)

__attribute__((noinline)) void adjust_threads() {
  if (at::in_parallel_region()) return;  // not inside an intra-op region: next call
  const uint64_t gen = g_gen.load();
  const int limit = g_limit.load();
  const long tid = static_cast<long>(syscall(SYS_gettid));
  std::lock_guard<std::mutex> lk(g_ymu);
  auto it = g_saved.find(tid);
  try {
    if (limit <= 0) {
      if (it != g_saved.end()) {
        // put the count back unless the program changed it meanwhile
        if (at::get_num_threads() == it->second.second) at::set_num_threads(it->second.first);
        g_saved.erase(it);
        g_restored++;
      }
    } else if (it == g_saved.end()) {
      const int cur = at::get_num_threads();
      if (cur > limit) {
        at::set_num_threads(limit);
        // at::set_num_threads also sets the count that threads starting from now take:
        // put that back from a helper thread (its own count does not matter), so only
        // this thread is lowered
        std::thread([cur] {
          try {
            at::set_num_threads(cur);
          } catch (...) {
            g_thread_errors++;
          }
        }).join();
        g_saved[tid] = {cur, limit};
        g_lowered++;
      }
    }
  } catch (...) {
    g_thread_errors++;
  }
  t_gen = gen;
}

inline void follow_thread_limit() {
  if (t_gen != g_gen.load(std::memory_order_relaxed)) adjust_threads();
}

void set_thread_limit(int limit) {
  g_limit.store(limit);
  g_gen++;
}

py::dict thread_limit_state() {
  py::dict d, saved;
  std::lock_guard<std::mutex> lk(g_ymu);
  for (auto& kv : g_saved) saved[py::int_(kv.first)] = py::make_tuple(kv.second.first, kv.second.second);
  d["limit"] = g_limit.load();
  d["lowered"] = g_lowered.load();
  d["restored"] = g_restored.load();
  d["errors"] = g_thread_errors.load();
  d["saved"] = saved;
  return d;
}

// Threads the Python kernels lowered before the switch to this path: restored from here.
void adopt_lowered(const py::dict& saved) {
  std::lock_guard<std::mutex> lk(g_ymu);
  for (auto item : saved) {
    auto v = item.second.cast<py::tuple>();
    g_saved[item.first.cast<long>()] = {v[0].cast<int>(), v[1].cast<int>()};
  }
  g_gen++;  // every thread looks again
}

// --- the stage profile (scripts/bench/served_call.py) ---------------------------------------
//
// Off unless a benchmark turns it on: then one relaxed load per call decides.  On, every
// call of a served op adds the time of each of its stages to process-wide totals, by
// outcome: a served call (key, lookup, inputs: runner inputs and AOTI handles and a
// container checked out, run: AOTInductor's container run, i.e. the kernel with its output
// allocation, outputs: stolen handles wrapped as tensors and pushed), or a remembered eager
// decision (key, lookup, eager: the original kernel from the boxed stack).  What the
// dispatcher does before and after (boxing, unboxing) is the benchmark's remainder.  The
// counters are the CPU's time-stamp counter, read on whichever core the call runs: a call
// preempted or moved between cores is left out (OUTLIER_TICKS).

enum Stage { ST_KEY, ST_LOOKUP, ST_INPUTS, ST_RUN, ST_OUTPUTS, ST_EAGER, N_STAGES };
enum Outcome { OC_SERVED, OC_EAGER, N_OUTCOMES };
std::atomic<bool> g_profile{false};
std::array<std::array<std::atomic<uint64_t>, N_STAGES>, N_OUTCOMES> g_ticks{};
std::array<std::atomic<uint64_t>, N_OUTCOMES> g_prof_calls{}, g_prof_outliers{};

inline uint64_t ticks() {
#if defined(__x86_64__)
  return __builtin_ia32_rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

// Nanoseconds per tick, measured against the steady clock over `ms` milliseconds.
double ns_per_tick(int ms = 50) {
  auto c0 = std::chrono::steady_clock::now();
  uint64_t t0 = ticks();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  uint64_t t1 = ticks();
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - c0).count();
  return t1 > t0 ? ns / static_cast<double>(t1 - t0) : 1.0;
}

void set_profile(bool on) { g_profile.store(on); }

void reset_profile() {
  for (auto& o : g_ticks)
    for (auto& t : o) t.store(0);
  for (auto& c : g_prof_calls) c.store(0);
  for (auto& c : g_prof_outliers) c.store(0);
}

py::dict profile_stats() {
  static const char* names[N_STAGES] = {"key", "lookup", "inputs", "run", "outputs", "eager"};
  const double scale = ns_per_tick();
  py::dict d;
  for (int o = 0; o < N_OUTCOMES; ++o) {
    py::dict one;
    one["calls"] = g_prof_calls[o].load();
    one["outliers"] = g_prof_outliers[o].load();
    for (int s = 0; s < N_STAGES; ++s) one[names[s]] = static_cast<double>(g_ticks[o][s].load()) * scale;
    d[o == OC_SERVED ? "served" : "eager"] = one;
  }
  d["ns_per_tick"] = scale;
  return d;
}

// A call longer than this many ticks (about 0.3 ms at 3 GHz) was preempted, or migrated
// between cores whose counters disagree: left out of the means, counted as an outlier.
constexpr uint64_t OUTLIER_TICKS = 1000000;

inline void account(int outcome, const uint64_t* marks, const int* stages, int n) {
  for (int i = 0; i < n; ++i) {
    if (marks[i + 1] < marks[i] || marks[n] - marks[0] > OUTLIER_TICKS) {
      g_prof_outliers[outcome].fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  for (int i = 0; i < n; ++i)
    g_ticks[outcome][stages[i]].fetch_add(marks[i + 1] - marks[i], std::memory_order_relaxed);
  g_prof_calls[outcome].fetch_add(1, std::memory_order_relaxed);
}

// --- a loaded kernel: one library, a pool of single-threaded model containers --------------
//
// AOTI's container, run the default way (AOTInductorModelContainerRun), hands each call a
// model instance from its pool and, when none is free, waits until the previous call's work
// on the device has finished: with one instance every CUDA call waits for the one before,
// so the CPU never runs ahead of the GPU.  AOTInductorModelContainerRunSingleThreaded skips
// that bookkeeping but is not thread-safe.  So a Kernel keeps its own pool of containers,
// each used by one thread at a time: a call checks one out (a short lock around a vector
// pop, never held while the kernel runs), runs it single-threaded and puts it back.  A
// thread that finds the pool empty creates another container from the library already
// loaded (its path is needed only once, at load time).  This is the same C ABI upstream's
// AOTIModelContainerRunner calls; kernels from the cache have no proxy-executor JSON.

class Kernel {
 public:
  using Handle = AOTInductorModelContainerHandle;
  // Most idle containers kept; a burst of more threads creates more, deleted on return.
  static constexpr size_t MAX_IDLE = 64;

  Kernel(const std::string& path, const std::string& device) : dev_(device) {
    lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      const char* e = dlerror();
      TORCH_CHECK(false, "cannot load ", path, ": ", e ? e : "dlopen failed");
    }
    create_ = reinterpret_cast<decltype(create_)>(dlsym(lib_, "AOTInductorModelContainerCreateWithDevice"));
    delete_ = reinterpret_cast<decltype(delete_)>(dlsym(lib_, "AOTInductorModelContainerDelete"));
    num_outputs_ = reinterpret_cast<decltype(num_outputs_)>(dlsym(lib_, "AOTInductorModelContainerGetNumOutputs"));
    run_ = reinterpret_cast<decltype(run_)>(dlsym(lib_, "AOTInductorModelContainerRunSingleThreaded"));
    if (!create_ || !delete_ || !num_outputs_ || !run_) {
      dlclose(lib_);
      TORCH_CHECK(false, path, " lacks the AOTInductor container interface (single-threaded run)");
    }
    Handle h = nullptr;
    try {
      h = create();
      TORCH_CHECK(num_outputs_(h, &n_out_) == AOTI_RUNTIME_SUCCESS, "AOTInductorModelContainerGetNumOutputs failed");
    } catch (...) {
      if (h) delete_(h);
      dlclose(lib_);
      throw;
    }
    free_.push_back(h);
  }

  ~Kernel() {
    for (Handle h : free_) delete_(h);
    dlclose(lib_);
  }

  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  // `marks` (the stage profile, or null): the time the inputs were ready and the time the
  // container returned.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, uint64_t* marks = nullptr) {
    void* stream = nullptr;
    if (dev_.is_cuda())
      stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(dev_).native_handle();
    auto in = torch::aot_inductor::unsafe_alloc_new_handles_from_tensors(inputs);
    std::vector<AtenTensorHandle> out(n_out_, nullptr);
    Handle h = checkout();
    if (marks) marks[0] = ticks();
    AOTIRuntimeError rc;
    try {
      rc = run_(h, in.data(), in.size(), out.data(), out.size(), reinterpret_cast<AOTInductorStreamHandle>(stream),
                nullptr);
    } catch (...) {
      delete_(h);  // never reuse a container left in an unknown state
      throw;
    }
    if (marks) marks[1] = ticks();
    if (rc != AOTI_RUNTIME_SUCCESS) {
      delete_(h);
      TORCH_CHECK(false, "AOTInductorModelContainerRunSingleThreaded failed");
    }
    checkin(h);
    return torch::aot_inductor::alloc_tensors_by_stealing_from_handles(out.data(), out.size());
  }

  uint64_t containers() const { return created_.load(); }

  // The index guards (compiler: adversarial.index_guards): true where every index of input
  // `pos` lies in [lo, hi); false sends the call to eager (which raises, or wraps a negative
  // index, as always).  The kernel itself checks inside an OpenMP region, where a failed
  // check would end the process.  An index input of another kind, device or layout than
  // the kernel was verified with never gets here (the fast key holds them).
  std::vector<std::array<int64_t, 3>> guards;

  bool guarded_ok(const std::vector<at::Tensor>& inputs) const {
    for (const auto& g : guards) {
      if (g[0] < 0 || static_cast<size_t>(g[0]) >= inputs.size()) return false;
      const at::Tensor& t = inputs[g[0]];
      if (!t.device().is_cpu()) return false;
      const int64_t n = t.numel();
      if (n == 0) continue;
      const at::Tensor c = t.is_contiguous() ? t : t.contiguous();
      if (c.scalar_type() == at::kLong) {
        const int64_t* p = c.const_data_ptr<int64_t>();
        for (int64_t i = 0; i < n; ++i)
          if (p[i] < g[1] || p[i] >= g[2]) return false;
      } else if (c.scalar_type() == at::kInt) {
        const int32_t* p = c.const_data_ptr<int32_t>();
        for (int64_t i = 0; i < n; ++i)
          if (p[i] < g[1] || p[i] >= g[2]) return false;
      } else {
        return false;
      }
    }
    return true;
  }

 private:
  Handle create() {
    Handle h = nullptr;
    const std::string d = dev_.str();
    TORCH_CHECK(create_(&h, 1, d.c_str(), nullptr) == AOTI_RUNTIME_SUCCESS && h,
                "AOTInductorModelContainerCreateWithDevice failed");
    created_++;
    return h;
  }
  Handle checkout() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!free_.empty()) {
        Handle h = free_.back();
        free_.pop_back();
        return h;
      }
    }
    return create();  // outside the lock
  }
  void checkin(Handle h) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (free_.size() < MAX_IDLE) {
        free_.push_back(h);
        return;
      }
    }
    delete_(h);
  }

  void* lib_ = nullptr;
  decltype(&AOTInductorModelContainerCreateWithDevice) create_ = nullptr;
  decltype(&AOTInductorModelContainerDelete) delete_ = nullptr;
  decltype(&AOTInductorModelContainerGetNumOutputs) num_outputs_ = nullptr;
  decltype(&AOTInductorModelContainerRunSingleThreaded) run_ = nullptr;
  c10::Device dev_;
  size_t n_out_ = 0;
  std::mutex mu_;
  std::vector<Handle> free_;
  std::atomic<uint64_t> created_{0};
};

using Runner = Kernel;

struct Decision {
  int64_t code;                     // kernel id >= 0, or EAGER_MISS / EAGER_FAILED
  std::shared_ptr<Runner> runner;   // set when code >= 0
};

struct Counters {
  std::atomic<uint64_t> hits{0}, misses{0}, failed{0};
};

struct State;

struct Slot {
  c10::OperatorHandle op;
  c10::SafeKernelFunction orig;
  std::string name;
  size_t nargs;
  std::vector<int> special;         // per argument: 0 plain, 1 dtype, 2 layout, 3 memory format
  std::unordered_map<std::string, Decision> known;   // guarded by State::mu
  Counters c;
  bool cuda = false;                // registered at the CUDA key (key_conditions' fields)
  Slot(c10::OperatorHandle o, c10::SafeKernelFunction k, std::string n)
      : op(std::move(o)), orig(std::move(k)), name(std::move(n)) {}
};

struct State {
  py::object decide, on_error;
  std::shared_mutex mu;
  std::vector<std::unique_ptr<Slot>> slots;
  std::unordered_map<int64_t, std::shared_ptr<Runner>> runners;
  int64_t next_id = 0;
  std::atomic<bool> enabled{true};
  // bumped by forget_eager(): an eager decision made before a bump is not remembered
  std::atomic<uint64_t> epoch{0};
  std::array<std::atomic<uint64_t>, INELIGIBLE_REASONS> ineligible{};
  std::atomic<uint64_t> slow{0}, wrapped{0}, grad{0}, views{0}, unkeyable{0}, kernel_errors{0},
      user_errors{0}, callback_errors{0}, remembered{0}, forgotten{0}, gated{0}, trial_calls{0}, guarded{0};
  ~State() {
    // The dispatcher may outlive the interpreter (static destruction at exit): never touch
    // Python objects then.
#if PY_VERSION_HEX >= 0x030D0000
    const bool finalizing = Py_IsFinalizing();
#else
    const bool finalizing = _Py_IsFinalizing();
#endif
    if (!Py_IsInitialized() || finalizing) {
      decide.release();
      on_error.release();
    } else {
      py::gil_scoped_acquire gil;
      decide = py::object();
      on_error = py::object();
    }
  }
};

// --- the fast key ------------------------------------------------------------------------

enum class Keyed { ok, wrapped, grad, view, unkeyable };

inline void put(std::string& k, const void* p, size_t n) {
  k.append(static_cast<const char*>(p), n);
}
inline void put64(std::string& k, int64_t v) { put(k, &v, sizeof v); }

// The globals a served result depends on (aoti_farm/signature/conditions.py names them),
// and this thread's intra-op thread count (a CPU kernel runs at its caller's).  Per device,
// only the fields that change that device's results (conditions._FIELDS' devices): the
// hook's decision for a call reads no other (conditions.mismatch), and the CUDA-only ones
// are table look-ups in torch 2.13's Context, paid on every CPU call otherwise.
uint64_t conditions_word(bool cuda) {
  auto& c = at::globalContext();
  uint64_t w = static_cast<uint64_t>(c10::get_default_dtype_as_scalartype());
  uint64_t bit = 1u << 8;
  auto flag = [&](bool b) {
    if (b) w |= bit;
    bit <<= 1;
  };
  if (cuda) {
    flag(c.allowTF32CuBLAS());
    flag(c.allowTF32CuDNN());
    flag(c.allowFP16AccumulationCuBLAS());
    flag(c.userEnabledCuDNN());
    flag(c.deterministicCuDNN());
    flag(c.benchmarkCuDNN());
  } else {
    flag(c.allowFP16ReductionCPU());
    flag(c.userEnabledMkldnn());
    flag(c.deterministicMkldnn());
  }
  flag(c.deterministicAlgorithms());
  w |= static_cast<uint64_t>(c.float32MatmulPrecision()) << 24;
  if (cuda) {
    w |= static_cast<uint64_t>(c.allowFP16ReductionCuBLAS()) << 32;
    w |= static_cast<uint64_t>(c.allowBF16ReductionCuBLAS()) << 40;
  }
  return w;
}

inline void key_conditions(std::string& k, bool cuda) {
  uint64_t w;
  try {
    w = conditions_word(cuda);
  } catch (...) {
    // torch refuses to read the precision once a program mixed its legacy and new APIs:
    // a value of its own (Python declines such calls: "float32_matmul_precision=mixed")
    w = ~uint64_t{0};
  }
  put64(k, static_cast<int64_t>(w));
  put64(k, static_cast<int64_t>(at::get_num_threads()));
}

Keyed key_tensor(std::string& k, const at::Tensor& t) {
  if (!t.defined()) {
    k.push_back('N');
    return Keyed::ok;
  }
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return Keyed::wrapped;
  if (t.layout() != c10::kStrided || t.is_nested() || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides())
    return Keyed::unkeyable;
  if (t.is_conj() || t.is_neg()) return Keyed::view;
  if (t.requires_grad() && c10::GradMode::is_enabled()) return Keyed::grad;
  k.push_back('T');
  k.push_back(static_cast<char>(t.scalar_type()));
  k.push_back(static_cast<char>(t.device().type()));
  k.push_back(static_cast<char>(t.device().index()));
  const int64_t d = t.dim();
  put64(k, d);
  put(k, t.sizes().data(), d * sizeof(int64_t));
  put(k, t.strides().data(), d * sizeof(int64_t));
  return Keyed::ok;
}

Keyed key_value(std::string& k, const c10::IValue& v) {
  if (v.isTensor()) return key_tensor(k, v.toTensor());
  if (v.isNone()) {
    k.push_back('N');
    return Keyed::ok;
  }
  if (v.isInt()) {
    k.push_back('i');
    put64(k, v.toInt());
    return Keyed::ok;
  }
  if (v.isDouble()) {
    k.push_back('f');
    double x = v.toDouble();
    put(k, &x, sizeof x);
    return Keyed::ok;
  }
  if (v.isBool()) {
    k.push_back(v.toBool() ? 'B' : 'b');
    return Keyed::ok;
  }
  if (v.isString()) {
    const auto& s = v.toStringRef();
    k.push_back('s');
    put64(k, static_cast<int64_t>(s.size()));
    k.append(s);
    return Keyed::ok;
  }
  if (v.isDevice()) {
    auto d = v.toDevice();
    k.push_back('d');
    k.push_back(static_cast<char>(d.type()));
    k.push_back(static_cast<char>(d.index()));
    return Keyed::ok;
  }
  if (v.isIntList()) {
    auto l = v.toIntList();
    k.push_back('I');
    put64(k, static_cast<int64_t>(l.size()));
    for (int64_t x : l) put64(k, x);
    return Keyed::ok;
  }
  if (v.isDoubleList()) {
    auto l = v.toDoubleList();
    k.push_back('F');
    put64(k, static_cast<int64_t>(l.size()));
    for (double x : l) put(k, &x, sizeof x);
    return Keyed::ok;
  }
  if (v.isBoolList()) {
    auto l = v.toBoolList();
    k.push_back('L');
    put64(k, static_cast<int64_t>(l.size()));
    for (bool x : l) k.push_back(x ? '1' : '0');
    return Keyed::ok;
  }
  if (v.isTensorList() || v.isList()) {
    // Tensor[] or Tensor?[] (a generic list of optional tensors); anything else is unkeyable
    auto l = v.toListRef();
    k.push_back('[');
    put64(k, static_cast<int64_t>(l.size()));
    for (const auto& x : l) {
      if (!(x.isTensor() || x.isNone())) return Keyed::unkeyable;
      Keyed r = key_value(k, x);
      if (r != Keyed::ok) return r;
    }
    return Keyed::ok;
  }
  return Keyed::unkeyable;  // SymInt, Generator, complex, objects...
}

// Runner inputs: every defined tensor, in schema order, lists flattened (as
// aoti_farm.compile.runner.flat_tensors and upstream's unpack_tensors do).
std::vector<at::Tensor> runner_inputs(const c10::IValue* args, size_t n) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < n; ++i) {
    const auto& v = args[i];
    if (v.isTensor()) {
      if (v.toTensor().defined()) out.push_back(v.toTensor());
    } else if (v.isTensorList() || v.isList()) {
      for (const auto& x : v.toListRef())
        if (x.isTensor() && x.toTensor().defined()) out.push_back(x.toTensor());
    }
  }
  return out;
}

py::object to_py(const c10::IValue& v, int special) {
  if (v.isInt()) {
    switch (special) {
      case 1: return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(v.toInt()))));
      case 2: return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v.toInt()))));
      case 3: return py::reinterpret_borrow<py::object>(
          torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v.toInt())));
      default: break;
    }
  }
  return torch::jit::toPyObject(v);
}

int special_kind(const c10::Argument& a) {
  c10::TypePtr t = a.real_type();
  if (t->kind() == c10::TypeKind::OptionalType) t = t->expectRef<c10::OptionalType>().getElementType();
  switch (t->kind()) {
    case c10::TypeKind::ScalarTypeType: return 1;
    case c10::TypeKind::LayoutType: return 2;
    case c10::TypeKind::MemoryFormatType: return 3;
    default: return 0;
  }
}

// --- the kernel ----------------------------------------------------------------------------

struct SlotKernel final : public c10::OperatorKernel {
  std::shared_ptr<State> st;
  Slot* slot;
  int64_t index;
  SlotKernel(std::shared_ptr<State> s, Slot* sl, int64_t i) : st(std::move(s)), slot(sl), index(i) {}

  void eager(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    slot->orig.callBoxed(op, ks, stack);
  }

  // Run kernel `kid`: true if it served the call (a hit).  False if it raised: eager ran
  // instead and its result is on the stack.  Where eager raises too the error is the
  // caller's: it propagates and the kernel stays; otherwise the kernel is reported.
  bool run(const c10::OperatorHandle& op, c10::DispatchKeySet ks, const std::shared_ptr<Runner>& runner,
           int64_t kid, torch::jit::Stack* stack, uint64_t* prof = nullptr) {
    const size_t n = slot->nargs;
    std::vector<at::Tensor> outputs;
    std::string what;
    auto inputs = runner_inputs(&*(stack->end() - n), n);
    if (!runner->guards.empty() && !runner->guarded_ok(inputs)) {
      st->guarded++;
      eager(op, ks, stack);   // eager's own error, or eager's result
      return false;
    }
    try {
      InsideGuard g;
      outputs = runner->run(inputs, prof ? prof + 2 : nullptr);
    } catch (const std::exception& e) {
      what = e.what();
      if (what.empty()) what = "kernel error";
    }
    if (!what.empty()) {
      try {
        eager(op, ks, stack);
      } catch (...) {
        st->user_errors++;
        throw;
      }
      st->kernel_errors++;
      report_error(kid, what.c_str());
      return false;
    }
    torch::jit::drop(*stack, n);
    for (auto& o : outputs) torch::jit::push(*stack, std::move(o));
    if (prof) {
      prof[4] = ticks();
      static const int stages[] = {ST_KEY, ST_LOOKUP, ST_INPUTS, ST_RUN, ST_OUTPUTS};
      account(OC_SERVED, prof - 1, stages, 5);
    }
    return true;
  }

  void report_error(int64_t kid, const char* what) {
    try {
      InsideGuard g;
      py::gil_scoped_acquire gil;
      st->on_error(kid, std::string(what));
    } catch (...) {
      st->callback_errors++;
    }
  }

  int64_t ask(const c10::IValue* args) {
    try {
      InsideGuard g;
      py::gil_scoped_acquire gil;
      py::list vals(slot->nargs);
      for (size_t i = 0; i < slot->nargs; ++i) vals[i] = to_py(args[i], slot->special[i]);
      return st->decide(index, vals).cast<int64_t>();
    } catch (...) {
      st->callback_errors++;
      return EAGER_ONCE;
    }
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    if (t_inside || !st->enabled.load(std::memory_order_relaxed)) return eager(op, ks, stack);
    if (__builtin_expect(t_force_state != nullptr, 0)) {
      if (t_force_state == st.get()) return forced(op, ks, stack);
      return eager(op, ks, stack);   // another registration's trial: never its kernel ids
    }
    follow_thread_limit();
    // the stage profile's marks: entry, key built, looked up, inputs ready, run, outputs
    uint64_t marks[6];
    const bool prof = g_profile.load(std::memory_order_relaxed);
    if (prof) marks[0] = ticks();
    const size_t n = slot->nargs;
    const c10::IValue* args = &*(stack->end() - n);
    thread_local std::string key;
    key.clear();
    key_conditions(key, slot->cuda);
    Keyed kd = Keyed::ok;
    for (size_t i = 0; i < n && kd == Keyed::ok; ++i) kd = key_value(key, args[i]);
    if (prof) marks[1] = ticks();
    switch (kd) {
      case Keyed::wrapped: st->wrapped++; return eager(op, ks, stack);
      case Keyed::grad: st->grad++; return eager(op, ks, stack);
      case Keyed::view: st->views++; return eager(op, ks, stack);
      case Keyed::unkeyable: {
        // Python decides, every time (nothing is remembered for such a call)
        st->unkeyable++;
        int64_t code = ask(args);
        if (code >= 0) {
          std::shared_ptr<Runner> r;
          {
            std::shared_lock<std::shared_mutex> lk(st->mu);
            auto it = st->runners.find(code);
            if (it != st->runners.end()) r = it->second;
          }
          if (r) {
            if (run(op, ks, r, code, stack)) slot->c.hits++;
            return;
          }
        }
        return eager(op, ks, stack);
      }
      case Keyed::ok: break;
    }
    Decision d{EAGER_ONCE, nullptr};
    bool found = false;
    {
      std::shared_lock<std::shared_mutex> lk(st->mu);
      auto it = slot->known.find(key);
      if (it != slot->known.end()) {
        d = it->second;
        found = true;
      }
    }
    if (found) {
      if (prof) marks[2] = ticks();
      if (d.code >= 0) {
        if (run(op, ks, d.runner, d.code, stack, prof ? marks + 1 : nullptr)) slot->c.hits++;
        return;
      }
      if (d.code <= EAGER_INELIGIBLE_BASE) st->ineligible[EAGER_INELIGIBLE_BASE - d.code]++;
      else if (d.code == EAGER_GATED) st->gated++;
      else (d.code == EAGER_FAILED ? slot->c.failed : slot->c.misses)++;
      eager(op, ks, stack);
      if (prof) {
        marks[3] = ticks();
        static const int stages[] = {ST_KEY, ST_LOOKUP, ST_EAGER};
        account(OC_EAGER, marks, stages, 3);
      }
      return;
    }
    st->slow++;
    const uint64_t epoch = st->epoch.load();
    int64_t code = ask(args);
    if (code >= 0) {
      std::shared_ptr<Runner> r;
      {
        std::unique_lock<std::shared_mutex> lk(st->mu);
        auto it = st->runners.find(code);
        if (it != st->runners.end()) {
          r = it->second;
          remember(key, code, r);
        }
      }
      if (r) {
        if (run(op, ks, r, code, stack)) slot->c.hits++;
        return;
      }
      return eager(op, ks, stack);
    }
    if (code <= EAGER_INELIGIBLE_BASE && code > EAGER_INELIGIBLE_BASE - INELIGIBLE_REASONS) {
      // decided by the call's metadata alone (the fast key holds all of it): no epoch check
      std::unique_lock<std::shared_mutex> lk(st->mu);
      remember(key, code, nullptr);
      return eager(op, ks, stack);
    }
    if (code == EAGER_MISS || code == EAGER_FAILED || code == EAGER_GATED) {
      std::unique_lock<std::shared_mutex> lk(st->mu);
      // the cache changed while Python decided: the decision may be stale already
      if (st->epoch.load() == epoch) remember(key, code, nullptr);
    }
    return eager(op, ks, stack);
  }

  void forced(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    std::shared_ptr<Runner> r;
    {
      std::shared_lock<std::shared_mutex> lk(st->mu);
      auto it = st->runners.find(t_force_id);
      if (it != st->runners.end()) r = it->second;
    }
    st->trial_calls++;
    if (!r) return eager(op, ks, stack);
    // a failure raises to the trial (which declines the kernel), never to a serving call
    const size_t n = slot->nargs;
    std::vector<at::Tensor> outputs;
    auto inputs = runner_inputs(&*(stack->end() - n), n);
    if (!r->guards.empty() && !r->guarded_ok(inputs)) return eager(op, ks, stack);
    {
      InsideGuard g;
      outputs = r->run(inputs);
    }
    torch::jit::drop(*stack, n);
    for (auto& o : outputs) torch::jit::push(*stack, std::move(o));
  }

  // caller holds st->mu uniquely
  void remember(const std::string& key, int64_t code, std::shared_ptr<Runner> r) {
    if (slot->known.size() >= KNOWN_LIMIT) {
      slot->known.clear();
      st->forgotten++;
    }
    slot->known[key] = Decision{code, std::move(r)};
    st->remembered++;
  }
};

// Drops the warnings of one registration (FastPath::add_op).
struct QuietHandler : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};
QuietHandler quiet_handler;

// --- the Python-facing object ----------------------------------------------------------------

class FastPath {
 public:
  FastPath(py::object decide, py::object on_error) : st_(std::make_shared<State>()) {
    st_->decide = std::move(decide);
    st_->on_error = std::move(on_error);
  }
  ~FastPath() { destroy(); }

  // Register our kernel for `name` (aten::add.Tensor) at `key` (CPU or CUDA); returns its slot.
  int64_t add_op(const std::string& name, const std::string& overload, const std::string& key) {
    if (!lib_)
      lib_ = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", std::nullopt, __FILE__, __LINE__);
    auto dk = c10::parseDispatchKey(key);
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
    TORCH_CHECK(op.hasKernelForDispatchKey(dk), name, " has no kernel for ", key);
    auto orig = op.getComputedKernelForDispatchKey(dk);
    std::string full = overload.empty() ? name : name + "." + overload;
    auto slot = std::make_unique<Slot>(op, std::move(orig), full);
    const auto& args = op.schema().arguments();
    slot->nargs = args.size();
    slot->cuda = dk == c10::DispatchKey::CUDA;
    for (const auto& a : args) slot->special.push_back(special_kind(a));
    Slot* raw = slot.get();
    int64_t index;
    {
      std::unique_lock<std::shared_mutex> lk(st_->mu);
      index = static_cast<int64_t>(st_->slots.size());
      st_->slots.push_back(std::move(slot));
    }
    {
      // The dispatcher warns, once per process, that a kernel overrides another: that is
      // this registration's purpose, and the warning would reach a program's or a compile
      // worker's stderr (no Python filter sees a c10 warning raised outside a torch binding).
      c10::WarningUtils::WarningHandlerGuard quiet(&quiet_handler);
      lib_->impl(full.c_str(), torch::dispatch(dk, torch::CppFunction::makeFromBoxedFunctor(
                                                       std::make_unique<SlotKernel>(st_, raw, index))));
    }
    return index;
  }

  // Load a kernel (its library, and a first container); returns its id.
  int64_t load(const std::string& path, const std::string& device,
               const std::vector<std::tuple<int64_t, int64_t, int64_t>>& guards) {
    std::shared_ptr<Runner> r;
    {
      py::gil_scoped_release nogil;
      r = std::make_shared<Runner>(path, device);
    }
    for (const auto& g : guards) r->guards.push_back({std::get<0>(g), std::get<1>(g), std::get<2>(g)});
    std::unique_lock<std::shared_mutex> lk(st_->mu);
    int64_t id = st_->next_id++;
    st_->runners[id] = std::move(r);
    return id;
  }

  // Forget a kernel and every remembered call that ran it.
  void unload(int64_t id) {
    std::shared_ptr<Runner> keep;  // released after the lock
    std::unique_lock<std::shared_mutex> lk(st_->mu);
    auto it = st_->runners.find(id);
    if (it != st_->runners.end()) {
      keep = std::move(it->second);
      st_->runners.erase(it);
    }
    for (auto& s : st_->slots)
      for (auto k = s->known.begin(); k != s->known.end();)
        k = (k->second.code == id) ? s->known.erase(k) : std::next(k);
  }

  // Forget every remembered eager decision (the cache index changed).
  void forget_eager() {
    std::unique_lock<std::shared_mutex> lk(st_->mu);
    st_->epoch++;
    for (auto& s : st_->slots)
      for (auto k = s->known.begin(); k != s->known.end();)
        k = (k->second.code < 0) ? s->known.erase(k) : std::next(k);
  }

  void set_enabled(bool on) { st_->enabled = on; }

  // This thread's served calls run kernel `id` (>= 0) of this registration; -1 ends it.
  void force(int64_t id) {
    t_force_state = id >= 0 ? static_cast<const void*>(st_.get()) : nullptr;
    t_force_id = id;
  }

  py::dict stats() {
    py::dict d, per;
    uint64_t hits = 0, misses = 0, failed = 0, known = 0;
    std::shared_lock<std::shared_mutex> lk(st_->mu);
    for (auto& s : st_->slots) {
      uint64_t h = s->c.hits, m = s->c.misses, f = s->c.failed;
      hits += h, misses += m, failed += f, known += s->known.size();
      if (h || m || f) per[py::str(s->name)] = py::make_tuple(h, m, f);
    }
    d["hits"] = hits;
    d["misses"] = misses;
    d["failed_signatures"] = failed;
    d["per_slot"] = per;
    d["slow_calls"] = st_->slow.load();
    d["wrapped_numbers"] = st_->wrapped.load();
    d["requires_grad"] = st_->grad.load();
    d["conj_neg_views"] = st_->views.load();
    d["gated"] = st_->gated.load();
    d["trial_calls"] = st_->trial_calls.load();
    d["guarded"] = st_->guarded.load();
    py::dict inel;
    for (int64_t i = 0; i < INELIGIBLE_REASONS; ++i)
      if (uint64_t v = st_->ineligible[i].load()) inel[py::int_(i)] = v;
    d["ineligible"] = inel;
    d["unkeyable"] = st_->unkeyable.load();
    d["kernel_errors"] = st_->kernel_errors.load();
    d["user_errors"] = st_->user_errors.load();
    d["callback_errors"] = st_->callback_errors.load();
    d["remembered"] = known;
    d["forgotten_full"] = st_->forgotten.load();
    d["kernels"] = st_->runners.size();
    uint64_t containers = 0;
    for (auto& kv : st_->runners) containers += kv.second->containers();
    d["containers"] = containers;
    return d;
  }

  // Put the original kernels back (idempotent).
  void destroy() {
    st_->enabled = false;
    lib_.reset();
  }

 private:
  std::shared_ptr<State> st_;
  std::unique_ptr<torch::Library> lib_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("EAGER_MISS") = EAGER_MISS;
  m.attr("EAGER_FAILED") = EAGER_FAILED;
  m.attr("EAGER_ONCE") = EAGER_ONCE;
  m.attr("EAGER_GATED") = EAGER_GATED;
  m.attr("EAGER_INELIGIBLE_BASE") = EAGER_INELIGIBLE_BASE;
  m.attr("INELIGIBLE_REASONS") = INELIGIBLE_REASONS;
  // this thread's calls of served ops go straight to eager (the speed gate's background trial)
  m.def("set_inside", [](bool on) {
    bool prev = t_inside;
    t_inside = on;
    return prev;
  });
  m.def("set_thread_limit", &set_thread_limit);
  m.def("follow_thread_limit", &follow_thread_limit);
  m.def("thread_limit_state", &thread_limit_state);
  m.def("adopt_lowered", &adopt_lowered);
  // the stage profile (scripts/bench/served_call.py)
  m.def("set_profile", &set_profile);
  m.def("reset_profile", &reset_profile);
  m.def("profile_stats", &profile_stats);
  py::class_<FastPath>(m, "FastPath")
      .def(py::init<py::object, py::object>())
      .def("add_op", &FastPath::add_op)
      .def("load", &FastPath::load)
      .def("unload", &FastPath::unload)
      .def("forget_eager", &FastPath::forget_eager)
      .def("set_enabled", &FastPath::set_enabled)
      .def("force", &FastPath::force)
      .def("stats", &FastPath::stats)
      .def("destroy", &FastPath::destroy);
}
