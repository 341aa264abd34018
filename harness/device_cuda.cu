#include <cstdio>
#include <memory>

#include <cstring>

#include "common/common.hpp"
#include "harness/cuda_device.hpp"

namespace memtrade {

void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

static std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

static std::string nvidia_driver_version() {
  // The driver's own version (e.g. 560.35.03) is not exposed by the runtime API; nvidia-smi has it.
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null", "r"), pclose);
  if (!p) return {};
  char buf[128] = {0};
  if (!std::fgets(buf, sizeof buf, p.get())) return {};
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

CudaStatus cuda_status() {
  static const CudaStatus status = [] {
    CudaStatus s;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      s.reason = std::string("no CUDA device: ") +
                 (err != cudaSuccess ? std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")"
                                     : std::string("none found"));
      cudaGetLastError();  // clear the sticky error
      return s;
    }
    cudaDeviceProp p{};
    cuda_check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    s.available = true;
    s.gpu_name = p.name;
    s.driver = nvidia_driver_version();
    if (s.driver.empty()) s.driver = "CUDA driver API " + version_string(drv);
    s.runtime = version_string(rt);
    return s;
  }();
  return status;
}

std::unique_ptr<Device> make_cuda_device() {
  auto s = cuda_status();
  if (!s.available) throw Skip(s.reason);
  return std::make_unique<CudaDevice>(0);
}

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  MT_CUDA(cudaSetDevice(ordinal_));
  MT_CUDA(cudaGetDeviceProperties(&props_, ordinal_));
  MT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MT_CUDA(cudaEventCreate(&start_));
  MT_CUDA(cudaEventCreate(&stop_));
  MT_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  MT_CUDA(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  MT_CUDA(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  for (cudaEvent_t& e : fences_) MT_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // Plain cudaMalloc per buffer (no caching), so the tracked figures are what the program asked for.
  memory_ = std::make_unique<TrackedAllocator>(
      "cuda:" + std::to_string(ordinal_),
      [](std::size_t n) -> void* {
        void* p = nullptr;
        if (cudaMalloc(&p, n) != cudaSuccess) {
          cudaGetLastError();
          return nullptr;
        }
        return p;
      },
      [](void* p) { cudaFree(p); });
  // Guard bytes are written and read back through the device (after the work on every stream is done).
  memory_->set_guard_copy(
      [](void* d, const void* h, std::size_t n) { cuda_check(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), "guard write"); },
      [](void* h, const void* d, std::size_t n) {
        if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
          cudaGetLastError();
          std::memset(h, TrackedAllocator::kGuardByte, n);  // a failed read is not reported as an overrun
        }
      });
  host_ = std::make_unique<TrackedAllocator>(
      "host",
      [](std::size_t n) -> void* {
        void* p = nullptr;
        if (cudaMallocHost(&p, n) != cudaSuccess) {
          cudaGetLastError();
          return nullptr;
        }
        return p;
      },
      [](void* p) { cudaFreeHost(p); });
}

CudaDevice::~CudaDevice() {
  if (flush_) cudaFree(flush_);
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
  cudaEventDestroy(fork_);
  cudaEventDestroy(join_);
  for (cudaEvent_t e : fences_) cudaEventDestroy(e);
  cudaStreamDestroy(copy_stream_);
  cudaStreamDestroy(stream_);
}

std::string CudaDevice::name() const { return std::string("cuda:") + std::to_string(ordinal_) + " " + props_.name; }

namespace {
cudaMemcpyKind memcpy_kind(CopyKind kind) {
  return kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
         : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                            : cudaMemcpyDeviceToDevice;
}
}  // namespace

// Synchronous, after every overlapped copy issued before it (which may read or write the same memory).
void CudaDevice::copy(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
  MT_CUDA(cudaStreamSynchronize(copy_stream_));
  MT_CUDA(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), stream_));
  MT_CUDA(cudaStreamSynchronize(stream_));
}

// Stream order through events: a wait enqueued on one stream holds it until the work recorded before the
// event on the other has finished (the event's state when the wait is enqueued, so re-recording is safe).
void CudaDevice::fork_copies() {
  MT_CUDA(cudaEventRecord(fork_, stream_));
  MT_CUDA(cudaStreamWaitEvent(copy_stream_, fork_, 0));
}

void CudaDevice::copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
  MT_CUDA(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), copy_stream_));
}

void CudaDevice::join_copies() {
  MT_CUDA(cudaEventRecord(join_, copy_stream_));
  MT_CUDA(cudaStreamWaitEvent(stream_, join_, 0));
}

int64_t CudaDevice::copy_fence() {
  const int64_t f = next_fence_++;
  MT_CUDA(cudaEventRecord(fences_[f % kCopyFences], copy_stream_));
  return f;
}

namespace {
void check_fence(int64_t fence, int64_t next) {
  MT_CHECK(fence >= 0 && fence < next && fence >= next - Device::kCopyFences,
           "copy fence " + std::to_string(fence) + " is not one of the last " + std::to_string(Device::kCopyFences) + " taken");
}
}  // namespace

void CudaDevice::wait_copies(int64_t fence) {
  check_fence(fence, next_fence_);
  MT_CUDA(cudaEventSynchronize(fences_[fence % kCopyFences]));
}

void CudaDevice::join_copies_until(int64_t fence) {
  check_fence(fence, next_fence_);
  MT_CUDA(cudaStreamWaitEvent(stream_, fences_[fence % kCopyFences], 0));
}

void CudaDevice::synchronize() {
  MT_CUDA(cudaStreamSynchronize(copy_stream_));
  MT_CUDA(cudaStreamSynchronize(stream_));
}

// Reads every 16 bytes of the flush buffer; the sum is stored only if it equals a value it never takes
// (the buffer holds one repeated byte), so the loads cannot be removed and nothing is written.
__global__ void flush_read_kernel(const uint4* __restrict__ buf, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(buf + i);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0xDEADBEEFu) *sink = acc;
}

// Cold caches without dirty lines: the kernel under test must find its data in DRAM, and must not pay for
// writing back what the flush left. A memset would leave the L2 full of dirty lines whose write-back
// (about L2 size / bandwidth, some 14 us on an H200) then lands inside the timed call; instead the flush
// reads a clean buffer of twice the L2 size, which evicts everything else, written once at allocation.
double CudaDevice::flush_caches() {
  if (!flush_) {
    const std::size_t l2 = static_cast<std::size_t>(props_.l2CacheSize > 0 ? props_.l2CacheSize : (64 << 20));
    flush_bytes_ = 2 * l2 + 16;  // the last 16 bytes: the sink
    MT_CUDA(cudaMalloc(&flush_, flush_bytes_));
    MT_CUDA(cudaMemsetAsync(flush_, 0x5A, flush_bytes_, stream_));
  }
  const std::size_t n = (flush_bytes_ - 16) / 16;
  auto* base = static_cast<unsigned char*>(flush_);
  flush_read_kernel<<<4 * props_.multiProcessorCount, 512, 0, stream_>>>(reinterpret_cast<const uint4*>(base), n,
                                                                          reinterpret_cast<unsigned*>(base + flush_bytes_ - 16));
  MT_CUDA(cudaGetLastError());
  MT_CUDA(cudaStreamSynchronize(stream_));
  return 0;  // not timed: a read of twice the L2 takes some 20 us, near the launch's own cost
}

double CudaDevice::time_call(const std::function<void()>& fn) {
  MT_CUDA(cudaEventRecord(start_, stream_));
  fn();
  MT_CUDA(cudaEventRecord(stop_, stream_));
  MT_CUDA(cudaEventSynchronize(stop_));
  float ms = 0;
  MT_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
  return ms * 1e-3;
}

std::optional<std::size_t> CudaDevice::backend_used_bytes() {
  std::size_t free_b = 0, total_b = 0;
  MT_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}

CudaDevice& as_cuda(Device& d) {
  auto* c = dynamic_cast<CudaDevice*>(&d);
  if (!c) throw Error("a CUDA implementation was handed a " + std::string(backend_name(d.backend())) + " device");
  return *c;
}

}  // namespace memtrade
