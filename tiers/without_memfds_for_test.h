#pragma once
// For tests: run a function as in a daemon out of file descriptors for memfds.

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <thread>

namespace kvpool::tiers {

// Runs `fn` on a thread of its own on which memfd_create fails with EMFILE, as in a daemon out of
// descriptors: a seccomp filter on that thread alone. (Taking every descriptor instead would
// starve the sanitizers' runtimes, which need some to check memory.) 0, or the errno with which
// the kernel or the container refused the filter (`fn` did not run then).
inline int WithoutMemfds(const std::function<void()>& fn) {
  int refused = ENOSYS;
  std::thread t([&] {
#if defined(__x86_64__)
    constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
    constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
    return;  // ENOSYS: no filter written for this architecture
#endif
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_memfd_create, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EMFILE & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      refused = errno;
      return;
    }
    refused = 0;
    fn();
  });
  t.join();
  return refused;
}

}  // namespace kvpool::tiers
