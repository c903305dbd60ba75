package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// agentRestartDelay spaces restarts of a failing messaging agent.
const agentRestartDelay = time.Second

// superviseAgent runs the messaging routing agent of cfg.Messaging until ctx
// ends, starting it again when it fails. A cluster file that does not load
// is retried too: an operator may be fixing it.
func (d *Daemon) superviseAgent(ctx context.Context) {
	m := d.cfg.Messaging
	for ctx.Err() == nil {
		err := d.runAgent(ctx, m.Cluster, m.Node)
		if ctx.Err() != nil {
			return
		}
		d.log.Error("messaging agent stopped; restarting", "err", err, "in", agentRestartDelay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(agentRestartDelay):
		}
	}
}

func (d *Daemon) runAgent(ctx context.Context, cluster, node string) error {
	cfg, err := messaging.LoadConfig(cluster)
	if err != nil {
		return err
	}
	a, err := messaging.NewAgent(cfg, node, messaging.AgentOptions{Logger: d.log.With("service", "messaging")})
	if err != nil {
		return err
	}
	d.agent.Store(a)
	defer d.agent.Store(nil)
	d.log.Info("messaging agent", "node", node, "addr", a.Addr(), "mode", cfg.Mode, "workers", cfg.Workers, "transfer_size", a.TransferSize())
	err = a.Run(ctx)
	if err == nil {
		err = errors.New("agent returned")
	}
	return err
}

// MsgStats implements api.Service.
func (d *Daemon) MsgStats() (messaging.Stats, error) {
	a := d.agent.Load()
	if a == nil {
		if d.cfg.Messaging == nil {
			return messaging.Stats{}, &api.NotFoundError{Err: errors.New("this node runs no messaging agent (see 'messaging' in lovelockd's config)")}
		}
		return messaging.Stats{}, errors.New("the messaging agent is not running (see lovelockd's log)")
	}
	return a.Stats(), nil
}
