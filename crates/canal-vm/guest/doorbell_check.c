/* Guest-side check of the ivshmem-doorbell path (tests/e2e/test_vm.py; docs/vm.md).
 *
 * Runs in a `canal vm run --doorbell SOCKET` guest, whose init has bound the ivshmem
 * device to vfio-pci and exported CANAL_IVSHMEM_DEVICE and CANAL_IVSHMEM_VFIO_GROUP. It
 * shows the steps libcanal's ivshmem transport needs to receive host -> guest wake-ups as
 * interrupts with a stock guest kernel:
 *   1. open the VFIO group/container/device, map BAR 2 (the region) and BAR 0 (registers);
 *   2. enable bus mastering (MSI-X messages are DMA writes; QEMU drops them otherwise);
 *   3. route MSI-X vector 0 to an eventfd (VFIO_DEVICE_SET_IRQS);
 *   4. publish "ARMED" + its IVPosition at region offset 0 and ring the host's doorbell
 *      (BAR 0 register 3 = peer << 16 | vector);
 *   5. wait (poll, 30 s limit) for the host's interrupt, print the host's message from
 *      region offset 64, ring the doorbell again.
 * The host must not interrupt before it sees ARMED: an MSI-X message sent while MSI-X is
 * still disabled is dropped by QEMU, not left pending.
 *
 * usage: doorbell_check HOST_PEER_ID        (built with gcc -static by the test)
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/vfio.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
    fprintf(stderr, "doorbell_check: %s: %s\n", what, strerror(errno));
    exit(1);
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        fprintf(stderr, "doorbell_check: %s is not set\n", name);
        exit(1);
    }
    return v;
}

static void *map_region(int device, unsigned index, uint64_t *size)
{
    struct vfio_region_info info = {.argsz = sizeof info, .index = index};
    if (ioctl(device, VFIO_DEVICE_GET_REGION_INFO, &info))
        die("VFIO_DEVICE_GET_REGION_INFO");
    void *p = mmap(NULL, info.size, PROT_READ | PROT_WRITE, MAP_SHARED, device, info.offset);
    if (p == MAP_FAILED)
        die("mmap BAR");
    *size = info.size;
    return p;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s HOST_PEER_ID\n", argv[0]);
        return 2;
    }
    unsigned host_peer = (unsigned)strtoul(argv[1], NULL, 0);
    const char *dev = env("CANAL_IVSHMEM_DEVICE");
    const char *bdf = strrchr(dev, '/') ? strrchr(dev, '/') + 1 : dev;

    int container = open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC);
    if (container < 0)
        die("/dev/vfio/vfio");
    int group = open(env("CANAL_IVSHMEM_VFIO_GROUP"), O_RDWR | O_CLOEXEC);
    if (group < 0)
        die("CANAL_IVSHMEM_VFIO_GROUP");
    if (ioctl(group, VFIO_GROUP_SET_CONTAINER, &container))
        die("VFIO_GROUP_SET_CONTAINER");
    if (ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1_IOMMU))
        die("VFIO_SET_IOMMU");
    int device = ioctl(group, VFIO_GROUP_GET_DEVICE_FD, bdf);
    if (device < 0)
        die("VFIO_GROUP_GET_DEVICE_FD");

    uint64_t shm_size, regs_size;
    volatile uint8_t *shm = map_region(device, VFIO_PCI_BAR2_REGION_INDEX, &shm_size);
    volatile uint32_t *regs = map_region(device, VFIO_PCI_BAR0_REGION_INDEX, &regs_size);

    struct vfio_region_info cfg = {.argsz = sizeof cfg, .index = VFIO_PCI_CONFIG_REGION_INDEX};
    if (ioctl(device, VFIO_DEVICE_GET_REGION_INFO, &cfg))
        die("config region");
    uint16_t cmd;
    if (pread(device, &cmd, 2, cfg.offset + 4) != 2)
        die("read PCI command");
    cmd |= 0x4; /* PCI_COMMAND_MASTER */
    if (pwrite(device, &cmd, 2, cfg.offset + 4) != 2)
        die("write PCI command");

    int efd = eventfd(0, EFD_CLOEXEC);
    if (efd < 0)
        die("eventfd");
    char buf[sizeof(struct vfio_irq_set) + sizeof(int)];
    struct vfio_irq_set *irq = (struct vfio_irq_set *)buf;
    irq->argsz = sizeof buf;
    irq->flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    irq->index = VFIO_PCI_MSIX_IRQ_INDEX;
    irq->start = 0;
    irq->count = 1;
    memcpy(irq->data, &efd, sizeof efd);
    if (ioctl(device, VFIO_DEVICE_SET_IRQS, irq))
        die("VFIO_DEVICE_SET_IRQS (MSI-X)");

    uint32_t me = regs[2]; /* IVPosition */
    memcpy((uint8_t *)shm + 8, &me, 4);
    __atomic_thread_fence(__ATOMIC_RELEASE); /* pairs with the host reading ARMED first */
    memcpy((uint8_t *)shm, "ARMED", 5);
    printf("armed region=%llu ivposition=%u\n", (unsigned long long)shm_size, me);
    fflush(stdout);
    regs[3] = (host_peer << 16) | 0; /* Doorbell */

    struct pollfd p = {.fd = efd, .events = POLLIN};
    double t0 = now();
    if (poll(&p, 1, 30000) != 1) {
        printf("no interrupt within 30 s\n");
        return 3;
    }
    uint64_t count;
    if (read(efd, &count, sizeof count) != sizeof count)
        die("read eventfd");
    char msg[65] = {0};
    memcpy(msg, (const uint8_t *)shm + 64, 64);
    printf("interrupt count=%llu after=%.3fs message=%s\n", (unsigned long long)count, now() - t0,
           msg);
    fflush(stdout);
    regs[3] = (host_peer << 16) | 0;
    printf("rang host\n");
    return 0;
}
