package console

import (
	"net/http"

	"github.com/oncekit/oncekit/outbox/fleet"
)

// fleetView is the fleet page: a row per database of the fleet's list.
type fleetView struct {
	Databases []fleet.DatabaseStatus
	Down      int
}

// fleetPage reads every database of the fleet's list, each within
// FleetTimeout and on a connection of its own, so that one that is down
// or slow shows as such without delaying the others.
func (con *Console) fleetPage(w http.ResponseWriter, r *http.Request) {
	dbs, err := con.cfg.Fleet()
	if err != nil {
		con.fail(w, r, "fleet", err)
		return
	}
	v := fleetView{Databases: fleet.ReadStatus(r.Context(), dbs, con.cfg.FleetTimeout, "oncekit-console")}
	for _, d := range v.Databases {
		if !d.Up {
			v.Down++
		}
	}
	con.render(w, r, "fleet", "Fleet", v)
}
