// aoti-farm's native hit path: a C++ kernel per served op that serves calls whose exact
// metadata it has already seen, without entering Python.  It is boxed (SlotKernel), or
// unboxed where the op's C++ signature is one the typed entry has (Typed, below).
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
#include <ATen/core/op_registration/infer_schema.h>
#include <ATen/core/op_registration/op_registration.h>
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
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

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
#include <limits>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
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

// The per-thread state every call reads, in one trivially constructed thread_local: one
// look-up of this library's thread-local block a call, and no initialization guard (a
// thread_local with a constructor, such as a std::string, is reached through a wrapper
// function on every access).
constexpr size_t KEY_MAX = 1024;       // a longer key is unkeyable (Python decides every time)
struct ThreadState {
  bool inside = false;                 // this thread is inside one of our kernels
  // The speed gate's on-host trial (runtime/trial.py): this thread's calls of a served op
  // run kernel force_id of the registration whose state is force_state, whatever their
  // key, so a kernel and eager are timed through the same dispatcher path.  Never
  // remembered, never counted as hits.
  const void* force_state = nullptr;
  int64_t force_id = -1;
  uint64_t gen = 0;                    // the thread-limit generation this thread last followed
  // The fast key being built (key_*, key_arg), looked up where it was built (Slot::known
  // is keyed by views); a key that does not fit is unkeyable.  Every member initialized,
  // so the thread_local is constant-initialized: no guard on access.
  struct KeyBuf {
    size_t n = 0;
    bool over = false;
    char b[KEY_MAX] = {};
    void clear() { n = 0, over = false; }
    __attribute__((always_inline)) void push_back(char c) {
      if (n < KEY_MAX) b[n++] = c;
      else over = true;
    }
    __attribute__((always_inline)) void append(const void* p, size_t len) {
      if (len <= KEY_MAX - n) {
        std::memcpy(b + n, p, len);
        n += len;
      } else {
        over = true;
      }
    }
  } key;
};
thread_local ThreadState t_state;

struct InsideGuard {
  bool prev;
  InsideGuard() : prev(t_state.inside) { t_state.inside = true; }
  ~InsideGuard() { t_state.inside = prev; }
};

// --- making room for the compiler (process-wide, shared by every FastPath) --------------------

std::atomic<int> g_limit{0};              // > 0: threads use at most this many intra-op threads
std::atomic<uint64_t> g_gen{1};           // bumped by every set_thread_limit()
std::atomic<uint64_t> g_lowered{0}, g_restored{0}, g_thread_errors{0};
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
  t_state.gen = gen;
}

inline void follow_thread_limit() {
  if (t_state.gen != g_gen.load(std::memory_order_relaxed)) adjust_threads();
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
  // remembered calls, by fast key; a key's bytes live in its entry (never moved), so a call
  // looks up the key it built in place, without copying it
  struct Known {
    std::unique_ptr<char[]> bytes;
    Decision d;
  };
  std::unordered_map<std::string_view, Known> known;   // guarded by State::mu
  Counters c;
  bool cuda = false;                // registered at the CUDA key (key_conditions' fields)
  bool typed = false;               // registered unboxed (the typed entry)
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
      user_errors{0}, callback_errors{0}, remembered{0}, forgotten{0}, gated{0}, trial_calls{0}, guarded{0},
      typed_boxed{0};   // calls the typed entry handed to the boxed kernel (a key not remembered or not keyable)
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

using KeyBuf = ThreadState::KeyBuf;
inline void put(KeyBuf& k, const void* p, size_t n) { k.append(p, n); }
inline void put64(KeyBuf& k, int64_t v) { put(k, &v, sizeof v); }

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

inline void key_conditions(KeyBuf& k, bool cuda) {
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

// The key's encoding of a value, one writer each, for the boxed kernel's IValues
// (key_value) and the typed entry's arguments (key_arg) alike.
inline Keyed key_none(KeyBuf& k) {
  k.push_back('N');
  return Keyed::ok;
}
inline Keyed key_int(KeyBuf& k, int64_t v) {
  k.push_back('i');
  put64(k, v);
  return Keyed::ok;
}
inline Keyed key_double(KeyBuf& k, double v) {
  k.push_back('f');
  put(k, &v, sizeof v);
  return Keyed::ok;
}
inline Keyed key_bool(KeyBuf& k, bool v) {
  k.push_back(v ? 'B' : 'b');
  return Keyed::ok;
}
inline Keyed key_str(KeyBuf& k, const char* p, size_t n) {
  k.push_back('s');
  put64(k, static_cast<int64_t>(n));
  k.append(p, n);
  return Keyed::ok;
}

Keyed key_tensor(KeyBuf& k, const at::Tensor& t) {
  if (!t.defined()) return key_none(k);
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

Keyed key_value(KeyBuf& k, const c10::IValue& v) {
  if (v.isTensor()) return key_tensor(k, v.toTensor());
  if (v.isNone()) return key_none(k);
  if (v.isInt()) return key_int(k, v.toInt());
  if (v.isDouble()) return key_double(k, v.toDouble());
  if (v.isBool()) return key_bool(k, v.toBool());
  if (v.isString()) {
    const auto& s = v.toStringRef();
    return key_str(k, s.data(), s.size());
  }
  if (v.isDevice()) {
    auto d = v.toDevice();
    k.push_back('d');
    k.push_back(static_cast<char>(d.type()));
    k.push_back(static_cast<char>(d.index()));
    return Keyed::ok;
  }
  // the lists' elements read in place (toListRef): a typed copy (toIntList) would count a
  // reference up and down on every call
  if (v.isIntList()) {
    auto l = v.toListRef();
    k.push_back('I');
    put64(k, static_cast<int64_t>(l.size()));
    for (const auto& x : l) put64(k, x.toInt());
    return Keyed::ok;
  }
  if (v.isDoubleList()) {
    auto l = v.toListRef();
    k.push_back('F');
    put64(k, static_cast<int64_t>(l.size()));
    for (const auto& x : l) {
      double d = x.toDouble();
      put(k, &d, sizeof d);
    }
    return Keyed::ok;
  }
  if (v.isBoolList()) {
    auto l = v.toListRef();
    k.push_back('L');
    put64(k, static_cast<int64_t>(l.size()));
    for (const auto& x : l) k.push_back(x.toBool() ? '1' : '0');
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
    if (t_state.inside || !st->enabled.load(std::memory_order_relaxed)) return eager(op, ks, stack);
    if (__builtin_expect(t_state.force_state != nullptr, 0)) {
      if (t_state.force_state == st.get()) return forced(op, ks, stack);
      return eager(op, ks, stack);   // another registration's trial: never its kernel ids
    }
    follow_thread_limit();
    // the stage profile's marks: entry, key built, looked up, inputs ready, run, outputs
    uint64_t marks[6];
    const bool prof = g_profile.load(std::memory_order_relaxed);
    if (prof) marks[0] = ticks();
    const size_t n = slot->nargs;
    const c10::IValue* args = &*(stack->end() - n);
    KeyBuf& kb = t_state.key;
    kb.clear();
    key_conditions(kb, slot->cuda);
    Keyed kd = Keyed::ok;
    for (size_t i = 0; i < n && kd == Keyed::ok; ++i) kd = key_value(kb, args[i]);
    if (kb.over && kd == Keyed::ok) kd = Keyed::unkeyable;
    const std::string_view key(kb.b, kb.n);
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
        d = it->second.d;
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
      auto it = st->runners.find(t_state.force_id);
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
  void remember(std::string_view key, int64_t code, std::shared_ptr<Runner> r) {
    if (slot->known.size() >= KNOWN_LIMIT) {
      slot->known.clear();
      st->forgotten++;
    }
    auto it = slot->known.find(key);
    if (it != slot->known.end()) {
      it->second.d = Decision{code, std::move(r)};
    } else {
      Slot::Known k{std::make_unique<char[]>(key.size() ? key.size() : 1), Decision{code, std::move(r)}};
      std::memcpy(k.bytes.get(), key.data(), key.size());
      const std::string_view own(k.bytes.get(), key.size());
      slot->known.emplace(own, std::move(k));
    }
    st->remembered++;
  }
};

// --- the typed entry --------------------------------------------------------------------------
//
// A boxed kernel makes the dispatcher box every call: the arguments copied into a stack of
// IValues (a heap allocation, a reference counted up and down per tensor, a string copied
// into a new object for a `str` argument), and eager's kernel unboxes them again.  For the
// ops whose C++ signature is one of TYPED_SIGNATURES below, the registration is an unboxed
// kernel instead: it builds the same fast key from the typed arguments (key_arg writes
// exactly the bytes key_value writes for the boxed argument), looks it up, and runs the
// remembered kernel, or calls eager's kernel unboxed.  Everything else (a call never seen,
// one the key cannot hold, this thread inside a kernel or in the speed gate's trial) goes
// through the boxed kernel above, boxed as the dispatcher would have.
//
// Calling eager's kernel unboxed needs the KernelFunction torch keeps inside the
// SafeKernelFunction it hands out (OperatorHandle::getComputedKernelForDispatchKey, added by
// pytorch/pytorch#158393, can be called boxed only).  That member is private: read here, in
// this one place, through the explicit-instantiation rule ([temp.spec.general]: access is
// not checked in an explicit instantiation), for the torch versions whose class was read
// and built against (2.13 on the VM, 2.11 on the GPU host; 2.12, between them, not built
// here).  The token torch invalidates when the original kernel is deregistered is checked
// on every call, as callBoxed does.  Upstream: the boxing cost is pytorch/pytorch#139521
// (open).  It can go when SafeKernelFunction (or torch.library.get_kernel) offers a typed
// call.  Elsewhere, or with AOTI_FARM_DEV=typed_entry=0, every op is registered boxed
// (FastPath::add_op).  tests/e2e/test_native_typed.py is its differential test: typed and
// boxed registrations give the same bits and the same keys.

#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11 && TORCH_VERSION_MINOR <= 13
#define AOTI_FARM_TYPED_ENTRY 1
template <typename Tag, typename Tag::type M>
struct Expose {
  friend typename Tag::type member(Tag) { return M; }
};
struct KernelOf {
  using type = c10::KernelFunction c10::SafeKernelFunction::*;
  friend type member(KernelOf);
};
struct TokenOf {
  using type = std::shared_ptr<c10::KernelToken> c10::SafeKernelFunction::*;
  friend type member(TokenOf);
};
template struct Expose<KernelOf, &c10::SafeKernelFunction::kernel_>;
template struct Expose<TokenOf, &c10::SafeKernelFunction::token_>;
#else
#define AOTI_FARM_TYPED_ENTRY 0
#endif

// key_arg: the bytes key_value writes for the IValue the dispatcher would box the argument
// into (ivalue.h's constructors: a concrete SymInt list decays to an int list, a Scalar to
// a double, bool or int, a ScalarType to an int).
inline Keyed key_arg(KeyBuf& k, const at::Tensor& t) { return key_tensor(k, t); }
inline Keyed key_arg(KeyBuf& k, const std::optional<at::Tensor>& t) {
  return t.has_value() ? key_tensor(k, *t) : key_none(k);
}
inline Keyed key_arg(KeyBuf& k, const c10::Scalar& s) {
  // IValue(Scalar): symbolic and complex values get tags key_value cannot hold; an
  // unsigned value above int64's range a UInt tag (unkeyable too); isUnsigned() is also
  // true of a non-negative signed value
  if (s.isSymbolic() || s.isComplex()) return Keyed::unkeyable;
  if (s.isFloatingPoint()) return key_double(k, s.toDouble());
  if (s.isBoolean()) return key_bool(k, s.toBool());
  if (s.isUnsigned()) {
    const uint64_t u = s.toUInt64();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Keyed::unkeyable;
    return key_int(k, static_cast<int64_t>(u));
  }
  return key_int(k, s.toLong());
}
inline Keyed key_arg(KeyBuf& k, c10::string_view s) { return key_str(k, s.data(), s.size()); }
inline Keyed key_arg(KeyBuf& k, int64_t v) { return key_int(k, v); }
inline Keyed key_arg(KeyBuf& k, double v) { return key_double(k, v); }
inline Keyed key_arg(KeyBuf& k, bool v) { return key_bool(k, v); }
inline Keyed key_ints(KeyBuf& k, at::IntArrayRef v) {
  k.push_back('I');
  put64(k, static_cast<int64_t>(v.size()));
  put(k, v.data(), v.size() * sizeof(int64_t));
  return Keyed::ok;
}
inline Keyed key_arg(KeyBuf& k, c10::SymIntArrayRef v) {
  auto ints = c10::asIntArrayRefSlowOpt(v);
  if (!ints.has_value()) return Keyed::unkeyable;   // symbolic: a SymInt list, unkeyable boxed too
  return key_ints(k, *ints);
}
inline Keyed key_arg(KeyBuf& k, at::OptionalIntArrayRef v) { return v.has_value() ? key_ints(k, *v) : key_none(k); }
inline Keyed key_arg(KeyBuf& k, std::optional<at::ScalarType> v) {
  return v.has_value() ? key_int(k, static_cast<int64_t>(*v)) : key_none(k);
}

// The runner's inputs from typed arguments: runner_inputs' rule (every defined tensor, in
// schema order).
inline void add_inputs(std::vector<at::Tensor>& v, const at::Tensor& t) {
  if (t.defined()) v.push_back(t);
}
inline void add_inputs(std::vector<at::Tensor>& v, const std::optional<at::Tensor>& t) {
  if (t.has_value() && t->defined()) v.push_back(*t);
}
template <class T>
inline void add_inputs(std::vector<at::Tensor>&, const T&) {}

// A kernel's outputs as the op's return type; false where their number differs.
inline bool as_return(std::vector<at::Tensor>& o, at::Tensor& r) {
  if (o.size() != 1) return false;
  r = std::move(o[0]);
  return true;
}
template <class... Ts>
inline bool as_return(std::vector<at::Tensor>& o, std::tuple<Ts...>& r) {
  if (o.size() != sizeof...(Ts)) return false;
  size_t i = 0;
  std::apply([&](auto&... x) { ((x = std::move(o[i++])), ...); }, r);
  return true;
}

template <class Sig>
struct Typed;

template <class Ret, class... Args>
struct Typed<Ret(Args...)> {
  std::shared_ptr<State> st;
  Slot* slot;
  SlotKernel helper;               // report_error, shared with the boxed kernel's rules
  c10::KernelFunction boxed;       // the boxed kernel above, called boxed (the dispatcher's boxing)
  c10::KernelFunction orig;        // eager's kernel, called unboxed
  std::shared_ptr<c10::KernelToken> token;

  Typed(std::shared_ptr<State> s, Slot* sl, int64_t index)
      : st(s), slot(sl), helper(s, sl, index),
        boxed(c10::KernelFunction::makeFromBoxedKernel(
            c10::BoxedKernel::makeFromFunctor(std::make_unique<SlotKernel>(s, sl, index)))) {
#if AOTI_FARM_TYPED_ENTRY
    orig = slot->orig.*member(KernelOf());
    token = slot->orig.*member(TokenOf());
#endif
  }

  Ret via_boxed(c10::DispatchKeySet ks, Args... args) {
    return boxed.template call<Ret, Args...>(slot->op, ks, std::forward<Args>(args)...);
  }
  Ret eager(c10::DispatchKeySet ks, Args... args) {
    if (token && !token->isValid()) return via_boxed(ks, std::forward<Args>(args)...);  // raises as torch does
    return orig.template call<Ret, Args...>(slot->op, ks, std::forward<Args>(args)...);
  }

  // The speed gate's trial (SlotKernel::forced's rules): kernel force_id, whatever the key.
  Ret forced(c10::DispatchKeySet ks, Args... args) {
    std::shared_ptr<Runner> r;
    {
      std::shared_lock<std::shared_mutex> lk(st->mu);
      auto it = st->runners.find(t_state.force_id);
      if (it != st->runners.end()) r = it->second;
    }
    st->trial_calls++;
    if (!r) return eager(ks, std::forward<Args>(args)...);
    std::vector<at::Tensor> inputs;
    inputs.reserve(sizeof...(Args));
    (add_inputs(inputs, args), ...);
    if (!r->guards.empty() && !r->guarded_ok(inputs)) return eager(ks, std::forward<Args>(args)...);
    std::vector<at::Tensor> outputs;
    {
      InsideGuard g;
      outputs = r->run(inputs);   // a failure raises to the trial, which declines the kernel
    }
    Ret out;
    TORCH_CHECK(as_return(outputs, out), "kernel returned another number of outputs");
    return out;
  }

  Ret operator()(c10::DispatchKeySet ks, Args... args) {
    // inside one of our kernels, unregistered, or another registration's trial: eager
    if (t_state.inside || !st->enabled.load(std::memory_order_relaxed)) return eager(ks, std::forward<Args>(args)...);
    if (__builtin_expect(t_state.force_state != nullptr, 0)) {
      if (t_state.force_state == st.get()) return forced(ks, std::forward<Args>(args)...);
      return eager(ks, std::forward<Args>(args)...);
    }
    follow_thread_limit();
    uint64_t marks[6];
    const bool prof = g_profile.load(std::memory_order_relaxed);
    if (prof) marks[0] = ticks();
    KeyBuf& kb = t_state.key;
    kb.clear();
    key_conditions(kb, slot->cuda);
    Keyed kd = Keyed::ok;
    ((kd = (kd == Keyed::ok ? key_arg(kb, args) : kd)), ...);
    if (kd != Keyed::ok || kb.over) {
      st->typed_boxed++;
      return via_boxed(ks, std::forward<Args>(args)...);  // its reason counted there
    }
    if (prof) marks[1] = ticks();
    Decision d{EAGER_ONCE, nullptr};
    {
      std::shared_lock<std::shared_mutex> lk(st->mu);
      auto it = slot->known.find(std::string_view(kb.b, kb.n));
      if (it == slot->known.end()) {
        lk.unlock();
        st->typed_boxed++;
        return via_boxed(ks, std::forward<Args>(args)...);   // Python decides (the boxed kernel)
      }
      d = it->second.d;
    }
    if (prof) marks[2] = ticks();
    if (d.code < 0) {
      if (d.code <= EAGER_INELIGIBLE_BASE) st->ineligible[EAGER_INELIGIBLE_BASE - d.code]++;
      else if (d.code == EAGER_GATED) st->gated++;
      else (d.code == EAGER_FAILED ? slot->c.failed : slot->c.misses)++;
      if (!prof) return eager(ks, std::forward<Args>(args)...);
      Ret r = eager(ks, std::forward<Args>(args)...);
      marks[3] = ticks();
      static const int stages[] = {ST_KEY, ST_LOOKUP, ST_EAGER};
      account(OC_EAGER, marks, stages, 3);
      return r;
    }
    // a remembered kernel: SlotKernel::run's rules (guards, a failing runner, the caller's errors)
    std::vector<at::Tensor> inputs;
    inputs.reserve(sizeof...(Args));
    (add_inputs(inputs, args), ...);
    if (!d.runner->guards.empty() && !d.runner->guarded_ok(inputs)) {
      st->guarded++;
      return eager(ks, std::forward<Args>(args)...);
    }
    std::vector<at::Tensor> outputs;
    std::string what;
    try {
      InsideGuard g;
      outputs = d.runner->run(inputs, prof ? marks + 3 : nullptr);
    } catch (const std::exception& e) {
      what = e.what();
      if (what.empty()) what = "kernel error";
    }
    Ret r;
    if (what.empty() && !as_return(outputs, r)) what = "kernel returned another number of outputs";
    if (!what.empty()) {
      try {
        r = eager(ks, std::forward<Args>(args)...);
      } catch (...) {
        st->user_errors++;
        throw;
      }
      st->kernel_errors++;
      helper.report_error(d.code, what.c_str());
      return r;
    }
    slot->c.hits++;
    if (prof) {
      marks[5] = ticks();
      static const int stages[] = {ST_KEY, ST_LOOKUP, ST_INPUTS, ST_RUN, ST_OUTPUTS};
      account(OC_SERVED, marks, stages, 5);
    }
    return r;
  }
};

// The C++ signatures registered typed (aten's: `Tensor` is `const at::Tensor&`, `str` is
// c10::string_view, `SymInt[]` is c10::SymIntArrayRef).  An op is registered typed when its
// schema is one of these (c10's own comparison, findSchemaDifferences) and it mutates nothing.
using T_ = const at::Tensor&;
using S_ = const c10::Scalar&;
using OT_ = const std::optional<at::Tensor>&;
using TT3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

template <class Sig>
struct TypedFunctor;
template <class Ret, class... Args>
struct TypedFunctor<Ret(Args...)> {
  std::shared_ptr<Typed<Ret(Args...)>> t;
  Ret operator()(c10::DispatchKeySet ks, Args... args) const { return (*t)(ks, std::forward<Args>(args)...); }
};

// Register `slot`'s kernel typed as Sig where the op's schema is Sig's; false (nothing
// registered) otherwise.
template <class Sig>
bool try_typed(torch::Library& lib, const std::string& full, c10::DispatchKey dk, const std::shared_ptr<State>& st,
               Slot* slot, int64_t index) {
  const c10::FunctionSchema& schema = slot->op.schema();
  if (c10::findSchemaDifferences(c10::inferFunctionSchemaFlattenedReturns<Sig>(), schema).has_value())
    return false;
  auto t = std::make_shared<Typed<Sig>>(st, slot, index);
  try {
    lib.impl(full.c_str(), torch::dispatch(dk, TypedFunctor<Sig>{std::move(t)}));
  } catch (const c10::Error&) {
    return false;   // the dispatcher refused it (its C++ signature check): registered boxed instead
  }
  return true;
}

// Register typed if the op's schema is one of the signatures, mutates nothing and the
// original kernel can be called unboxed; true if registered.
bool register_typed(torch::Library& lib, const std::string& full, c10::DispatchKey dk, const std::shared_ptr<State>& st,
                    Slot* slot, int64_t index) {
#if AOTI_FARM_TYPED_ENTRY
  const c10::FunctionSchema& schema = slot->op.schema();
  if (schema.is_mutable()) return false;
  for (const auto& r : schema.returns())
    if (r.alias_info()) return false;   // a view or an out= result
  return try_typed<at::Tensor(T_)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, T_)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, T_, S_)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, S_)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, S_, S_)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, T_, T_)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, T_, T_, S_, S_)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, c10::string_view)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, int64_t, bool)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, int64_t, T_)>(lib, full, dk, st, slot, index) ||
         try_typed<at::Tensor(T_, at::OptionalIntArrayRef, bool, std::optional<at::ScalarType>)>(lib, full, dk, st,
                                                                                                 slot, index) ||
         try_typed<at::Tensor(T_, std::optional<at::ScalarType>)>(lib, full, dk, st, slot, index) ||
         try_typed<TT3(T_, c10::SymIntArrayRef, OT_, OT_, double)>(lib, full, dk, st, slot, index);
#else
  (void)lib, (void)full, (void)dk, (void)st, (void)slot, (void)index;
  return false;
#endif
}

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
  // `typed`: registered unboxed where the op's signature allows (register_typed).
  int64_t add_op(const std::string& name, const std::string& overload, const std::string& key, bool typed) {
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
      if (typed && register_typed(*lib_, full, dk, st_, raw, index)) {
        raw->typed = true;
      } else {
        lib_->impl(full.c_str(), torch::dispatch(dk, torch::CppFunction::makeFromBoxedFunctor(
                                                         std::make_unique<SlotKernel>(st_, raw, index))));
      }
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
        k = (k->second.d.code == id) ? s->known.erase(k) : std::next(k);
  }

  // Forget every remembered eager decision (the cache index changed).
  void forget_eager() {
    std::unique_lock<std::shared_mutex> lk(st_->mu);
    st_->epoch++;
    for (auto& s : st_->slots)
      for (auto k = s->known.begin(); k != s->known.end();)
        k = (k->second.d.code < 0) ? s->known.erase(k) : std::next(k);
  }

  void set_enabled(bool on) { st_->enabled = on; }

  // This thread's served calls run kernel `id` (>= 0) of this registration; -1 ends it.
  void force(int64_t id) {
    t_state.force_state = id >= 0 ? static_cast<const void*>(st_.get()) : nullptr;
    t_state.force_id = id;
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
    py::list typed;
    for (auto& s : st_->slots)
      if (s->typed) typed.append(py::str(s->name));
    d["typed_ops"] = typed;
    d["typed_boxed"] = st_->typed_boxed.load();
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
    bool prev = t_state.inside;
    t_state.inside = on;
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
