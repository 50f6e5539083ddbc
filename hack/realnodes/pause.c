/* The sandbox ("pause") process of every pod: it holds the pod's namespaces,
 * sleeps until SIGTERM or SIGINT and, as PID 1 of a shared PID namespace,
 * reaps orphaned children. Static, so the image is FROM scratch. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction term = {.sa_handler = stop}, child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGTERM, &term, NULL);
  sigaction(SIGINT, &term, NULL);
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
  return 0;
}
