/*
 * The program of the e2e-test-images/nonewprivs stand-in, as upstream's: installed setuid root
 * (mode 4755), it prints the effective uid it runs with. A container running as a non-root
 * user prints 0 when it may gain privileges and its own uid under no_new_privs.
 */
#include <stdio.h>
#include <unistd.h>

int main(void)
{
	printf("Effective uid: %d\n", (int)geteuid());
	return 0;
}
