/**
 * The instance has been told to stop and is draining (SHUTDOWN_DRAIN_MS): `/health` answers 503 so
 * that a load balancer or Kubernetes' readiness probe takes it out, and every answer closes its
 * connection so that a keep-alive client opens its next one elsewhere. Requests are served as
 * usual meanwhile: the drain only moves clients away before the listener closes, when a request a
 * client wrote to an idle connection would be reset. One per app (createApp), read by its adapter's
 * hooks, the health check, and the routes that start long work (a reconciliation run, a bulk
 * issuance), which turn it away while draining. With no drain it is set all the same, from the
 * signal to the close.
 */
export class Stopping {
  private began = false;

  begin(): void {
    this.began = true;
  }

  get draining(): boolean {
    return this.began;
  }
}
