package main

// Namespaces as kube-apiserver's namespace registry stores them
// (pkg/registry/core/namespace/{strategy.go,storage/storage.go} of Kubernetes v1.36):
// created Active with the "kubernetes" finalizer in spec.finalizers and the
// kubernetes.io/metadata.name label (kept on every update); a delete marks the
// namespace Terminating (deletionTimestamp set) while spec.finalizers is not empty; the
// finalize subresource edits spec.finalizers; a delete with no spec finalizer left removes
// it. There is no namespace controller: nothing empties a terminating namespace or
// removes its finalizer. A test plays that controller: PUT namespaces/<name>/finalize
// without the finalizer removes a terminating namespace. NamespaceLifecycle admission refuses new objects in a terminating
// namespace, as in kube-apiserver.

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage"
	storageerr "k8s.io/apiserver/pkg/storage/errors"
	"k8s.io/apiserver/pkg/util/dryrun"
)

func namespaceOnCreate(o runtime.Object) {
	ns := o.(*corev1.Namespace)
	ns.Status = corev1.NamespaceStatus{Phase: corev1.NamespaceActive}
	namespaceNameLabel(ns, nil)
	for _, f := range ns.Spec.Finalizers {
		if f == corev1.FinalizerKubernetes {
			return
		}
	}
	ns.Spec.Finalizers = append(ns.Spec.Finalizers, corev1.FinalizerKubernetes)
}

// namespaceNameLabel sets the immutable kubernetes.io/metadata.name label, which
// namespaceSelectors of webhooks match on.
func namespaceNameLabel(o, _ runtime.Object) {
	ns := o.(*corev1.Namespace)
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[corev1.LabelMetadataName] = ns.Name
}

type namespaceREST struct{ *mainREST }

// Delete marks a namespace that still has spec finalizers Terminating, and removes one
// that has none.
func (r *namespaceREST) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions) (runtime.Object, bool, error) {
	current, err := r.Get(ctx, name, &metav1.GetOptions{})
	if err != nil {
		return nil, false, err
	}
	ns := current.(*corev1.Namespace)
	if len(ns.Spec.Finalizers) == 0 {
		return r.Store.Delete(ctx, name, deleteValidation, options)
	}
	if options == nil {
		options = metav1.NewDeleteOptions(0)
	}
	preconditions := storage.Preconditions{UID: &ns.UID}
	if options.Preconditions != nil {
		if options.Preconditions.UID != nil && *options.Preconditions.UID != ns.UID {
			return nil, false, apierrors.NewConflict(corev1.Resource("namespaces"), name,
				fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", *options.Preconditions.UID, ns.UID))
		}
		preconditions.ResourceVersion = options.Preconditions.ResourceVersion
	}
	key, err := r.Store.KeyFunc(ctx, name)
	if err != nil {
		return nil, false, err
	}
	out := r.Store.NewFunc()
	err = r.Store.Storage.GuaranteedUpdate(ctx, key, out, false, &preconditions,
		storage.SimpleUpdate(func(existing runtime.Object) (runtime.Object, error) {
			ns, ok := existing.(*corev1.Namespace)
			if !ok {
				return nil, fmt.Errorf("expected *v1.Namespace, got %T", existing)
			}
			if err := deleteValidation(ctx, ns); err != nil {
				return nil, err
			}
			if ns.DeletionTimestamp.IsZero() {
				now := metav1.Now()
				ns.DeletionTimestamp = &now
			}
			ns.Status.Phase = corev1.NamespaceTerminating
			return ns, nil
		}), dryrun.IsDryRun(options.DryRun), nil)
	if err != nil {
		err = storageerr.InterpretGetError(err, corev1.Resource("namespaces"), name)
		err = storageerr.InterpretUpdateError(err, corev1.Resource("namespaces"), name)
		if _, ok := err.(*apierrors.StatusError); !ok {
			err = apierrors.NewInternalError(err)
		}
		return nil, false, err
	}
	return out, false, nil
}

// namespaceShouldDeleteDuringUpdate: an update that leaves a deleted namespace with no
// finalizer of either kind removes it (kube-apiserver's ShouldDeleteNamespaceDuringUpdate).
func namespaceShouldDeleteDuringUpdate(ctx context.Context, key string, obj, existing runtime.Object) bool {
	ns, ok := obj.(*corev1.Namespace)
	return ok && len(ns.Spec.Finalizers) == 0 && genericregistry.ShouldDeleteDuringUpdate(ctx, key, obj, existing)
}

// finalizeStrategy lets the finalize subresource change spec.finalizers only.
type finalizeStrategy struct{ strategy }

func (finalizeStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	ns, oldNs := obj.(*corev1.Namespace), old.(*corev1.Namespace)
	finalizers, managed := ns.Spec.Finalizers, ns.ManagedFields
	*ns = *oldNs.DeepCopy()
	ns.Spec.Finalizers, ns.ManagedFields = finalizers, managed
}
