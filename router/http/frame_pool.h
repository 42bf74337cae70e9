// Coroutine frames from a per-thread free list per size class.
//
// Asio recycles one frame per thread, so every coroutine nested below another
// (each phase of the proxy, each use_awaitable operation inside it) was a
// malloc and a free per request; here a frame of a size the thread used before
// is reused. executor.h hands every coroutine typed on the io threads'
// executor to this pool.
//
// Threading: runs on the thread that allocates or frees (a frame freed on
// another thread goes to that thread's list); the lists are freed at thread
// exit. No locks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>

namespace kvroute {

class FramePool {
 public:
  static void* allocate(size_t size) {
    const size_t c = size_class(size);
    if (c >= kClasses) return ::operator new(size);
    Lists& l = lists();
    if (Block* b = l.head[c]) {
      l.head[c] = b->next;
      --l.count[c];
      return b;
    }
    return ::operator new((c + 1) * kGranule);
  }
  static void deallocate(void* p, size_t size) noexcept {
    const size_t c = size_class(size);
    Lists& l = lists();
    if (c >= kClasses || l.count[c] >= kKeep) {
      ::operator delete(p);
      return;
    }
    Block* b = static_cast<Block*>(p);
    b->next = l.head[c];
    l.head[c] = b;
    ++l.count[c];
  }

 private:
  static constexpr size_t kGranule = 64;
  static constexpr size_t kClasses = 64;  // frames up to 4 KiB
  static constexpr uint32_t kKeep = 256;  // per class and thread
  struct Block {
    Block* next;
  };
  struct Lists {
    std::array<Block*, kClasses> head{};
    std::array<uint32_t, kClasses> count{};
    ~Lists() {
      for (Block* b : head)
        while (b) {
          Block* next = b->next;
          ::operator delete(b);
          b = next;
        }
    }
  };
  static size_t size_class(size_t size) { return (size + kGranule - 1) / kGranule - 1; }
  static Lists& lists() {
    thread_local Lists l;
    return l;
  }
};

}  // namespace kvroute
