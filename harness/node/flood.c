/* A hostile container's process for the real node's test image: it opens N connections to a
 * unix socket (the accounting broker's), asks "used 0" on each and counts how each is answered:
 * served ("used ..."), refused ("error too many connections ..."), silent (nothing within 10 s)
 * or unconnected (connect failed within 2 s). It prints the counts, then holds every
 * connection open until it is killed. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: flood N SOCKET\n");
        return 2;
    }
    int n = atoi(argv[1]);
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
        lim.rlim_cur = lim.rlim_max;
        setrlimit(RLIMIT_NOFILE, &lim);
    }
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", argv[2]);
    struct pollfd *fds = calloc((size_t)n, sizeof *fds);
    int open_ = 0, served = 0, refused = 0, silent = 0, unconnected = 0;
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd < 0) {
            unconnected++;
            continue;
        }
        struct timeval tv = {2, 0}; /* a blocking connect waits for the backlog this long */
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
            write(fd, "used 0\n", 7) != 7) {
            close(fd);
            unconnected++;
            continue;
        }
        fds[open_].fd = fd;
        fds[open_].events = POLLIN;
        open_++;
    }
    int waiting = open_;
    time_t until = time(NULL) + 10;
    while (waiting > 0 && time(NULL) < until) {
        if (poll(fds, (nfds_t)open_, 500) <= 0)
            continue;
        for (int i = 0; i < open_; i++) {
            if (fds[i].fd < 0 || fds[i].revents == 0)
                continue;
            char buf[128] = {0};
            ssize_t got = read(fds[i].fd, buf, sizeof buf - 1);
            if (got > 0 && strncmp(buf, "used ", 5) == 0)
                served++;
            else if (got > 0 && strncmp(buf, "error too many connections", 26) == 0)
                refused++;
            else
                silent++;
            fds[i].fd = -fds[i].fd - 1; /* answered: poll no more, keep it open */
            waiting--;
        }
    }
    silent += waiting;
    printf("FLOOD served=%d refused=%d silent=%d unconnected=%d\n", served, refused, silent,
           unconnected);
    fflush(stdout);
    for (;;)
        pause();
}
