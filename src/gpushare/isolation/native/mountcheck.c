/*
 * gpushare-mountcheck: an OCI createRuntime hook that refuses a container whose isolation mounts
 * are not what the device plugin gave it.
 *
 * Why a hook. Admission compares a pod's volume paths as text, but the runtime resolves each
 * mount destination inside the image's root, links included: an image that links
 * /x/sched -> /var/run/gpushare-sched and a volume at /x/sched land the volume over the plugin's
 * read-only schedules; the same with /etc hides /etc/ld.so.preload and the limits. Only after
 * the runtime has made every mount can anyone see where they landed, and only from outside the
 * container. runc runs createRuntime hooks in the runtime's namespaces after the rootfs and its
 * mounts are in place and before pivot_root, with no process of the container running yet
 * (OCI runtime-spec config.md, "createRuntime Hooks"; runc libcontainer/rootfs_linux.go signals
 * the parent to run them once the mounts are done). The device plugin names this hook in a CDI
 * device it adds to every isolated container's Allocate answer.
 *
 * What it checks. It reads the OCI state on stdin (pid, bundle) and the bundle's config.json.
 * For every mount whose source lies under one of the --under host directories (the plugin's
 * state and library directories) it resolves the destination inside the container's root, as
 * the runtime and every program in the container will (links followed, never above the root),
 * and requires the same file as the host source (device and inode): a volume or another mount
 * over it, or over any directory on its way, gives another file. A mount the plugin made
 * read-only must be read-only there. For a directory it also looks up each entry of the host
 * directory inside the container, so nothing is mounted over a single schedule or socket.
 * A host entry replaced while it looks (the plugin renames a new schedule into place) is looked
 * up again, a few times.
 *
 * Any failure refuses the container (exit 1, the reason on stderr, which the runtime puts in
 * the pod's event): a check that cannot be made is not a check that passed.
 *
 * No library but the C library, linked statically: it runs on the host, whatever the host has.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define MAX_JSON (16 << 20)  /* config.json: containerd's are a few kB */
#define MAX_DEPTH 64          /* JSON nesting */
#define MAX_UNDER 8           /* --under directories */
#define MAX_LINKS 40          /* links followed in one lookup, as the kernel's limit */
#define MAX_ENTRIES 65536     /* entries checked in one mounted directory */
#define RETRIES 5             /* looks at an entry the plugin may be replacing */

static const char *container_id = "";

static void refuse(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void refuse(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "gpushare-mountcheck: container %s refused: ", container_id);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* ---- a small JSON reader: values kept as spans of the input, looked up by key ---- */

typedef struct {
    const char *s;
    size_t n, i;
} cursor;

static void ws(cursor *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' ||
                           c->s[c->i] == '\r'))
        c->i++;
}

static int skip_value(cursor *c, int depth);

static int skip_string(cursor *c) {
    if (c->i >= c->n || c->s[c->i] != '"') return -1;
    for (c->i++; c->i < c->n; c->i++) {
        char ch = c->s[c->i];
        if (ch == '\\') {
            c->i++;
        } else if (ch == '"') {
            c->i++;
            return 0;
        } else if ((unsigned char)ch < 0x20) {
            return -1;
        }
    }
    return -1;
}

static int skip_compound(cursor *c, int depth, char open, char close) {
    if (depth > MAX_DEPTH) return -1;
    c->i++; /* the opening bracket */
    (void)open;
    ws(c);
    if (c->i < c->n && c->s[c->i] == close) {
        c->i++;
        return 0;
    }
    for (;;) {
        ws(c);
        if (close == '}') {
            if (skip_string(c) != 0) return -1;
            ws(c);
            if (c->i >= c->n || c->s[c->i] != ':') return -1;
            c->i++;
        }
        if (skip_value(c, depth + 1) != 0) return -1;
        ws(c);
        if (c->i >= c->n) return -1;
        if (c->s[c->i] == ',') {
            c->i++;
            continue;
        }
        if (c->s[c->i] == close) {
            c->i++;
            return 0;
        }
        return -1;
    }
}

static int skip_value(cursor *c, int depth) {
    ws(c);
    if (c->i >= c->n) return -1;
    char ch = c->s[c->i];
    if (ch == '"') return skip_string(c);
    if (ch == '{') return skip_compound(c, depth, '{', '}');
    if (ch == '[') return skip_compound(c, depth, '[', ']');
    size_t start = c->i;
    while (c->i < c->n && strchr(",}] \t\r\n", c->s[c->i]) == NULL) c->i++;
    return c->i > start ? 0 : -1;
}

/* The value of key in the object at c (positioned at '{'); a cursor over it, or n=0. */
static cursor member(cursor obj, const char *key) {
    cursor none = {obj.s, 0, 0};
    ws(&obj);
    if (obj.i >= obj.n || obj.s[obj.i] != '{') return none;
    obj.i++;
    size_t klen = strlen(key);
    for (;;) {
        ws(&obj);
        if (obj.i < obj.n && obj.s[obj.i] == '}') return none;
        size_t kstart = obj.i + 1;
        if (skip_string(&obj) != 0) return none;
        size_t kend = obj.i - 1;
        ws(&obj);
        if (obj.i >= obj.n || obj.s[obj.i] != ':') return none;
        obj.i++;
        ws(&obj);
        size_t vstart = obj.i;
        if (skip_value(&obj, 1) != 0) return none;
        if (kend - kstart == klen && memcmp(obj.s + kstart, key, klen) == 0) {
            cursor v = {obj.s, obj.i, vstart};
            return v;
        }
        ws(&obj);
        if (obj.i < obj.n && obj.s[obj.i] == ',') obj.i++;
    }
}

/* The k-th element of the array at c, or n=0. */
static cursor element(cursor arr, size_t k) {
    cursor none = {arr.s, 0, 0};
    ws(&arr);
    if (arr.i >= arr.n || arr.s[arr.i] != '[') return none;
    arr.i++;
    for (size_t j = 0;; j++) {
        ws(&arr);
        if (arr.i >= arr.n || arr.s[arr.i] == ']') return none;
        size_t vstart = arr.i;
        if (skip_value(&arr, 1) != 0) return none;
        if (j == k) {
            cursor v = {arr.s, arr.i, vstart};
            return v;
        }
        ws(&arr);
        if (arr.i < arr.n && arr.s[arr.i] == ',') arr.i++;
    }
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* The string at c, unescaped into out (size cap); 0, or -1 when it is not a plain string.
 * \u escapes are kept only for ASCII: a path with other ones is refused, not guessed at. */
static int string_at(cursor c, char *out, size_t cap) {
    if (c.n == 0) return -1;
    ws(&c);
    if (c.i >= c.n || c.s[c.i] != '"') return -1;
    size_t o = 0;
    for (c.i++; c.i < c.n; c.i++) {
        char ch = c.s[c.i];
        if (ch == '"') {
            out[o] = 0;
            return 0;
        }
        if (ch == '\\') {
            if (++c.i >= c.n) return -1;
            switch (c.s[c.i]) {
            case '"': ch = '"'; break;
            case '\\': ch = '\\'; break;
            case '/': ch = '/'; break;
            case 'n': ch = '\n'; break;
            case 't': ch = '\t'; break;
            case 'r': ch = '\r'; break;
            case 'b': ch = '\b'; break;
            case 'f': ch = '\f'; break;
            case 'u': {
                int v = 0;
                for (int k = 1; k <= 4; k++) {
                    int h = c.i + k < c.n ? hexval(c.s[c.i + k]) : -1;
                    if (h < 0) return -1;
                    v = v * 16 + h;
                }
                if (v == 0 || v > 0x7f) return -1;
                ch = (char)v;
                c.i += 4;
                break;
            }
            default: return -1;
            }
        }
        if (o + 1 >= cap) return -1;
        out[o++] = ch;
    }
    return -1;
}

static char *read_all(int fd, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL) return NULL;
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_JSON) {
                free(buf);
                errno = EFBIG;
                return NULL;
            }
            cap *= 2;
            char *grown = realloc(buf, cap);
            if (grown == NULL) {
                free(buf);
                return NULL;
            }
            buf = grown;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0) {
            if (errno == EINTR) continue;
            free(buf);
            return NULL;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    *len = n;
    return buf;
}

/* ---- resolving a path inside the container's root ---- */

/* Open path (absolute, as the container names it) below root_fd with O_PATH, following links
 * as the container would but never above its root: ".." at the root stays there, an absolute
 * link starts again from the root. -1 with errno set when it cannot be reached. */
static int open_in_root(int root_fd, const char *path) {
    char todo[PATH_MAX * 2];
    int links = 0;
    if (strlen(path) >= sizeof(todo)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(todo, path);
    int cur = dup(root_fd);
    if (cur < 0) return -1;
    char *p = todo;
    for (;;) {
        while (*p == '/') p++;
        if (*p == 0) return cur;
        char *end = strchr(p, '/');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char name[NAME_MAX + 1];
        if (len > NAME_MAX) {
            close(cur);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(name, p, len);
        name[len] = 0;
        p += len;
        if (strcmp(name, ".") == 0) continue;
        if (strcmp(name, "..") == 0) {
            struct stat here, top;
            if (fstat(cur, &here) == 0 && fstat(root_fd, &top) == 0 && here.st_dev == top.st_dev &&
                here.st_ino == top.st_ino)
                continue; /* at the container's root: ".." is the root */
        }
        int next = openat(cur, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            int saved = errno;
            close(cur);
            errno = saved;
            return -1;
        }
        struct stat st;
        if (fstat(next, &st) != 0) {
            int saved = errno;
            close(next);
            close(cur);
            errno = saved;
            return -1;
        }
        if (!S_ISLNK(st.st_mode)) {
            close(cur);
            cur = next;
            continue;
        }
        /* a link: its target, then what is left of the path */
        char target[PATH_MAX];
        ssize_t tlen = readlinkat(next, "", target, sizeof(target) - 1);
        close(next);
        if (tlen < 0 || ++links > MAX_LINKS) {
            close(cur);
            errno = tlen < 0 ? errno : ELOOP;
            return -1;
        }
        target[tlen] = 0;
        char rest[PATH_MAX * 2];
        if ((size_t)tlen + strlen(p) + 2 > sizeof(rest)) {
            close(cur);
            errno = ENAMETOOLONG;
            return -1;
        }
        if (snprintf(rest, sizeof(rest), "%s/%s", target, p) >= (int)sizeof(rest)) {
            close(cur);
            errno = ENAMETOOLONG;
            return -1;
        }
        strcpy(todo, rest);
        p = todo;
        if (target[0] == '/') {
            close(cur);
            cur = dup(root_fd);
            if (cur < 0) return -1;
        }
    }
}

static int has_option(cursor options, const char *opt) {
    char buf[256];
    for (size_t k = 0;; k++) {
        cursor o = element(options, k);
        if (o.n == 0) return 0;
        if (string_at(o, buf, sizeof(buf)) == 0 && strcmp(buf, opt) == 0) return 1;
    }
}

static int under(const char *source, char **dirs, int ndirs) {
    for (int k = 0; k < ndirs; k++) {
        size_t len = strlen(dirs[k]);
        while (len > 1 && dirs[k][len - 1] == '/') len--;
        if (strncmp(source, dirs[k], len) == 0 && (source[len] == '/' || source[len] == 0))
            return 1;
    }
    return 0;
}

static void sleep_ms(long ms) {
    struct timespec t = {0, ms * 1000000L};
    nanosleep(&t, NULL);
}

/* Each entry of the host directory source must be the same file inside the container. */
static void check_entries(const char *dest, const char *source, int inside) {
    DIR *d = opendir(source);
    if (d == NULL) refuse("cannot read the plugin's directory %s: %s", source, strerror(errno));
    struct dirent *e;
    long seen = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (++seen > MAX_ENTRIES)
            refuse("%s has more than %d entries: not a directory the plugin mounts", source,
                   MAX_ENTRIES);
        int same = 0, gone = 0;
        for (int attempt = 0; attempt < RETRIES && !same && !gone; attempt++) {
            if (attempt) sleep_ms(20);
            struct stat host, there;
            if (fstatat(dirfd(d), e->d_name, &host, AT_SYMLINK_NOFOLLOW) != 0) {
                gone = errno == ENOENT; /* removed by the plugin meanwhile */
                continue;
            }
            if (fstatat(inside, e->d_name, &there, AT_SYMLINK_NOFOLLOW) != 0) continue;
            same = host.st_dev == there.st_dev && host.st_ino == there.st_ino;
        }
        if (!same && !gone)
            refuse("%s/%s is not the plugin's %s/%s: something in the pod is mounted over it",
                   dest, e->d_name, source, e->d_name);
    }
    closedir(d);
}

static void check_mount(int root_fd, const char *dest, const char *source, int readonly) {
    struct stat host;
    if (stat(source, &host) != 0)
        refuse("the plugin's mount source %s for %s is missing: %s", source, dest, strerror(errno));
    int fd = open_in_root(root_fd, dest);
    if (fd < 0)
        refuse("%s (the plugin's %s) cannot be found in the container: %s; a volume or a link "
               "in the image moved something over it",
               dest, source, strerror(errno));
    struct stat there;
    if (fstat(fd, &there) != 0) refuse("cannot stat %s in the container: %s", dest, strerror(errno));
    if (there.st_dev != host.st_dev || there.st_ino != host.st_ino)
        refuse("%s in the container is not the plugin's %s: a volume of the pod, or a link in "
               "its image, puts another file there; remove the volume, or the link, that "
               "reaches %s",
               dest, source, dest);
    if (readonly) {
        struct statvfs vfs;
        if (fstatvfs(fd, &vfs) != 0 || !(vfs.f_flag & ST_RDONLY))
            refuse("%s is the plugin's %s but not read-only in the container", dest, source);
    }
    if (S_ISDIR(host.st_mode)) {
        int inside = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (inside < 0) refuse("cannot open %s in the container: %s", dest, strerror(errno));
        check_entries(dest, source, inside);
        close(inside);
    }
    close(fd);
}

static void usage(void) {
    fprintf(stderr,
            "usage: gpushare-mountcheck --under HOST_DIR [--under HOST_DIR ...]\n"
            "an OCI createRuntime hook: reads the container's state on stdin\n");
    exit(2);
}

int main(int argc, char **argv) {
    char *dirs[MAX_UNDER];
    int ndirs = 0;
    for (int k = 1; k < argc; k++) {
        if (strcmp(argv[k], "--under") == 0 && k + 1 < argc && argv[k + 1][0] == '/' &&
            ndirs < MAX_UNDER)
            dirs[ndirs++] = argv[++k];
        else
            usage();
    }
    if (ndirs == 0) usage();

    size_t len;
    char *state_text = read_all(0, &len);
    if (state_text == NULL) refuse("cannot read the OCI state on stdin: %s", strerror(errno));
    cursor state = {state_text, len, 0};
    static char id[256], bundle[PATH_MAX], rootpath[PATH_MAX];
    if (string_at(member(state, "id"), id, sizeof(id)) == 0) container_id = id;
    cursor pidv = member(state, "pid");
    long pid = pidv.n ? strtol(pidv.s + pidv.i, NULL, 10) : 0;
    if (pid <= 0 || string_at(member(state, "bundle"), bundle, sizeof(bundle)) != 0)
        refuse("the OCI state on stdin has no pid or bundle (is this a createRuntime hook?)");

    char path[PATH_MAX * 2];
    if (snprintf(path, sizeof(path), "%s/config.json", bundle) >= (int)sizeof(path))
        refuse("the bundle path is too long");
    int cfd = open(path, O_RDONLY | O_CLOEXEC);
    if (cfd < 0) refuse("cannot open %s: %s", path, strerror(errno));
    char *config_text = read_all(cfd, &len);
    close(cfd);
    if (config_text == NULL) refuse("cannot read %s: %s", path, strerror(errno));
    cursor config = {config_text, len, 0};
    if (skip_value(&config, 0) != 0) refuse("%s is not JSON", path);
    config.i = 0;
    if (string_at(member(member(config, "root"), "path"), rootpath, sizeof(rootpath)) != 0)
        refuse("%s has no root.path", path);

    /* the container's root as its mount namespace shows it, before pivot_root */
    int written = rootpath[0] == '/'
                      ? snprintf(path, sizeof(path), "/proc/%ld/root%s", pid, rootpath)
                      : snprintf(path, sizeof(path), "/proc/%ld/root%s/%s", pid, bundle, rootpath);
    if (written >= (int)sizeof(path)) refuse("the container's root path is too long");
    int root_fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0) refuse("cannot open the container's root %s: %s", path, strerror(errno));

    cursor mounts = member(config, "mounts");
    int checked = 0;
    for (size_t k = 0;; k++) {
        cursor m = element(mounts, k);
        if (m.n == 0) break;
        static char dest[PATH_MAX], source[PATH_MAX];
        if (string_at(member(m, "source"), source, sizeof(source)) != 0) continue;
        if (!under(source, dirs, ndirs)) continue;
        if (string_at(member(m, "destination"), dest, sizeof(dest)) != 0 || dest[0] != '/')
            refuse("the mount of %s has no absolute destination", source);
        check_mount(root_fd, dest, source, has_option(member(m, "options"), "ro"));
        checked++;
    }
    if (getenv("GPUSHARE_MOUNTCHECK_VERBOSE") != NULL)
        fprintf(stderr, "gpushare-mountcheck: container %s: %d mounts checked\n", container_id,
                checked);
    return 0;
}
