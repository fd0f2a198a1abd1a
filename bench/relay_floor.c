/* relay_floor.c - the least any proxy adds: a TCP relay that copies bytes
 * both ways with blocking reads and writes (one thread per direction,
 * TCP_NODELAY, no parsing). bench/bench_remote.py runs the stamping upstream
 * through it in the same run as the direct and routed paths, so the table
 * shows how much of the route's added latency is the extra loopback hop
 * itself (a thread wake-up and a socket copy) on the machine at hand.
 *
 * usage: relay_floor LISTEN_PORT UPSTREAM_PORT   (prints "ready" when listening)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int upstream_port;

typedef struct pipe_pair {
    int from, to;
} pipe_pair;

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void *copy_loop(void *arg)
{
    pipe_pair *p = arg;
    char buf[65536];
    for (;;) {
        ssize_t n = read(p->from, buf, sizeof(buf));
        if (n <= 0)
            break;
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(p->to, buf + off, (size_t)(n - off));
            if (w <= 0)
                goto out;
            off += w;
        }
    }
out:
    shutdown(p->to, SHUT_WR);
    return NULL;
}

static void *serve_one(void *arg)
{
    int c = (int)(intptr_t)arg;
    int u = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)upstream_port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (u < 0 || connect(u, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(c);
        if (u >= 0)
            close(u);
        return NULL;
    }
    nodelay(c);
    nodelay(u);
    pipe_pair up = { c, u }, down = { u, c };
    pthread_t t;
    pthread_create(&t, NULL, copy_loop, &up);
    copy_loop(&down);
    pthread_join(t, NULL);
    close(c);
    close(u);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: relay_floor LISTEN_PORT UPSTREAM_PORT\n");
        return 2;
    }
    int port = atoi(argv[1]);
    upstream_port = atoi(argv[2]);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(s, 64) != 0) {
        perror("relay_floor");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0)
            continue;
        pthread_t t;
        if (pthread_create(&t, NULL, serve_one, (void *)(intptr_t)c) == 0)
            pthread_detach(t);
        else
            close(c);
    }
}
